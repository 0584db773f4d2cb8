"""BudgetMem pipeline and controls: conformance, tiers per axis, budgeted and recorded
auxiliary calls, per-module costs, the seeded random control, names and errors."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.strategies import REGISTRY, load_strategy
from pytest_budgetbench.strategies.base import Regime, StrategyContext
from pytest_budgetbench.strategies.budgetmem.pipeline import extract_final, question_of
from pytest_budgetbench.strategies.budgetmem.router import BudgetMemRouter, checkpoint_path
from pytest_budgetbench.strategies.budgetmem.strategy import (
    SUMMARY_HEADER,
    BudgetMem,
    BudgetMemHigh,
    BudgetMemLow,
    BudgetMemMid,
    BudgetMemRandom,
)
from pytest_budgetbench.strategies.budgetmem.tiers import MODULES
from pytest_budgetbench.tasks._fixtures import locomo_samples, write_json
from pytest_budgetbench.tasks.base import TaskOptions
from pytest_budgetbench.tasks.locomo import LoCoMoTask
from pytest_budgetbench.testing import EchoAuxModel, HashingEmbedder, check_strategy
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.strategy_helpers import ScriptedAux, memory_items

CONTROLS = (BudgetMemLow, BudgetMemMid, BudgetMemHigh, BudgetMemRandom)


def recording_aux(tokens: TokenCounter, reply: str = "1, 2 FINAL: Nugget - pet - user"
                  ) -> ScriptedAux:
    """The scripted aux model, no limit of its own, answering every module with ``reply``."""
    return ScriptedAux(tokens, reply=reply)


def _context(tokens: TokenCounter, aux: Any = None, **options: str) -> StrategyContext:
    return StrategyContext(tokens=tokens, item_id="memory/0000", seed=0, aux=aux,
                           embedder_factory=HashingEmbedder, options=dict(options))


def _run(strategy: BudgetMem, budget: int = 1024, aux: Any = None, item: int = 0,
         **options: str) -> tuple[list[Message], StrategyContext]:
    tokens = ApproxCounter()
    context = _context(tokens, aux, **options)
    strategy.reset(context)
    messages = list(memory_items(item + 1, 2500)[item].messages)
    return strategy.apply(messages, budget), context


def _axis_context(axis: str, named: Sequence[str] = ()) -> Any:
    def make(tokens: TokenCounter, budget: int) -> StrategyContext:
        context = _context(tokens, EchoAuxModel(tokens, budget), budgetmem_axis=axis)
        context.aux_models = {name: EchoAuxModel(tokens, budget) for name in named}
        return context

    return make


# -- conformance -------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", CONTROLS, ids=lambda c: c.name)
def test_controls_conform(cls: type[BudgetMem]) -> None:
    check_strategy(cls, max_examples=30)


@pytest.mark.parametrize(("axis", "named"), [("reasoning", ()), ("capacity", ("small", "large"))])
def test_llm_axes_conform(axis: str, named: tuple[str, ...]) -> None:
    for cls in (BudgetMemHigh, BudgetMemRandom):
        check_strategy(cls, context_factory=_axis_context(axis, named), max_examples=15)


def test_conforms_with_the_exact_counter(gguf: GGUFCounter) -> None:
    check_strategy(BudgetMemRandom, tokens=gguf, max_examples=6)


def test_names_and_regimes() -> None:
    assert [c.name for c in CONTROLS] == ["budgetmem_low", "budgetmem_mid", "budgetmem_high",
                                         "budgetmem_random"]
    for cls in CONTROLS:
        assert load_strategy(cls.name).__class__ is cls
        assert Regime.AUXILIARY_MODEL in cls.regimes


# -- the pipeline's prompt ---------------------------------------------------------------------
@pytest.mark.parametrize("cls", [BudgetMemLow, BudgetMemMid], ids=lambda c: c.name)
def test_prompt_is_system_summary_query_with_the_evidence(cls: type[BudgetMem]) -> None:
    prompt, _context = _run(cls(), budget=1024)
    item = memory_items(1, 2500)[0]
    assert prompt[0] == item.messages[0] and prompt[-1] == item.messages[-1]
    assert len(prompt) == 3 and prompt[1]["role"] == "system"
    assert text_of(prompt[1]).startswith(SUMMARY_HEADER)
    assert str(item.answer) in text_of(prompt[1])  # the planted fact survived the pipeline
    assert ApproxCounter().count_messages(prompt) <= 1024


def test_no_room_means_system_and_query_only() -> None:
    tokens = ApproxCounter()
    messages = list(memory_items(1, 2500)[0].messages)
    floor = tokens.count_messages([messages[0], messages[-1]])
    aux = recording_aux(tokens)
    strategy = BudgetMemHigh()
    strategy.reset(_context(tokens, aux))
    assert strategy.apply(messages, floor + 2) == [messages[0], messages[-1]]
    assert aux.calls == []


# -- tiers and their auxiliary calls -----------------------------------------------------------
def test_implementation_axis_calls_the_model_only_at_high() -> None:
    tokens = ApproxCounter()
    low_aux, high_aux = recording_aux(tokens), recording_aux(tokens)
    _run(BudgetMemLow(), aux=low_aux)
    _run(BudgetMemMid(), aux=low_aux)
    _prompt, context = _run(BudgetMemHigh(), aux=high_aux)
    assert low_aux.calls == []
    assert [c[0] for c in high_aux.calls] == [f"budgetmem/{m}/HIGH" for m in MODULES]
    info = context.info["budgetmem"]
    assert info["tiers"] == dict.fromkeys(MODULES, "HIGH")
    assert info["module_aux_calls"] == dict.fromkeys(MODULES, 1)
    assert info["module_aux_input_tokens"] == {m: c[1] for m, c in zip(MODULES, high_aux.calls,
                                                                        strict=True)}
    assert info["cost_tokens"] == sum(info["module_aux_input_tokens"].values()) + sum(
        info["module_aux_output_tokens"].values())


def test_every_module_is_timed_heuristic_tiers_included() -> None:
    _prompt, context = _run(BudgetMemMid())
    info = context.info["budgetmem"]
    assert set(info["module_s"]) == set(MODULES)
    assert all(s >= 0 for s in info["module_s"].values())
    assert sum(info["module_s"].values()) > 0  # MID embeds and ranks: not free
    assert info["cost_tokens"] == 0
    json.dumps(context.info)  # lands on the row as strategy_info


@pytest.mark.parametrize("budget", [160, 300, 700])
def test_every_auxiliary_prompt_fits_the_budget(budget: int) -> None:
    tokens = ApproxCounter()
    for axis in ("implementation", "reasoning"):
        aux = recording_aux(tokens, reply="word " * 400)
        prompt, _context = _run(BudgetMemHigh(), budget=budget, aux=aux, budgetmem_axis=axis)
        assert aux.calls, "the budget leaves room: the model should be asked"
        assert max(c[1] for c in aux.calls) <= budget
        assert tokens.count_messages(prompt) <= budget


def test_filter_high_keeps_the_passages_the_model_names() -> None:
    tokens = ApproxCounter()
    _prompt, context = _run(BudgetMemHigh(), aux=recording_aux(tokens, reply="2"))
    assert context.info["budgetmem"]["kept"] == 1
    _prompt, context = _run(BudgetMemHigh(), aux=recording_aux(tokens, reply="none"))
    assert context.info["budgetmem"]["kept"] == context.info["budgetmem"]["retrieved"]


def test_reasoning_axis_prompt_styles() -> None:
    tokens = ApproxCounter()
    purposes = {}
    for cls in (BudgetMemLow, BudgetMemMid, BudgetMemHigh):
        aux = recording_aux(tokens)
        _run(cls(), aux=aux, budgetmem_axis="reasoning")
        purposes[cls.name] = aux.calls
    low, mid, high = purposes.values()
    assert [c[0] for c in low] == [f"budgetmem/{m}/LOW" for m in MODULES]
    assert not any("step by step" in text_of(c[2][-1]) for c in low)
    assert all("step by step" in text_of(c[2][-1]) for c in mid)
    assert [c[0] for c in high] == [f"budgetmem/{m}/HIGH/{step}" for m in MODULES
                                    for step in ("plan-act", "reflect")]
    assert "Draft: Nugget - pet - user" in text_of(high[1][2][-1])  # reflect reads the draft


def test_capacity_axis_uses_named_models_and_falls_back() -> None:
    tokens = ApproxCounter()
    default, small, large = recording_aux(tokens), recording_aux(tokens), recording_aux(tokens)
    for cls in (BudgetMemLow, BudgetMemMid, BudgetMemHigh):
        context = _context(tokens, default, budgetmem_axis="capacity")
        context.aux_models = {"small": small, "large": large}
        strategy = cls()
        strategy.reset(context)
        strategy.apply(list(memory_items(1, 2500)[0].messages), 1024)
    assert {c[0].split("/")[2] for c in small.calls} == {"LOW"}
    assert {c[0].split("/")[2] for c in default.calls} == {"MID"}  # no "medium" configured
    assert {c[0].split("/")[2] for c in large.calls} == {"HIGH"}
    assert len(small.calls) == len(large.calls) == len(MODULES)


def test_bad_axis_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="budgetmem_axis must be one of implementation"):
        _run(BudgetMemLow(), budgetmem_axis="vibes")
    with pytest.raises(ConfigError, match="budgetmem_top_k"):
        _run(BudgetMemLow(), budgetmem_top_k="0")


def test_top_k_bounds_retrieval() -> None:
    _prompt, context = _run(BudgetMemLow(), budgetmem_top_k="2")
    assert context.info["budgetmem"]["retrieved"] == 2


# -- the random control ------------------------------------------------------------------------
def _random_tiers(seed: int, item_id: str) -> dict[str, str]:
    tokens = ApproxCounter()
    context = StrategyContext(tokens=tokens, item_id=item_id, seed=seed,
                              aux=EchoAuxModel(tokens, 1024), embedder_factory=HashingEmbedder)
    strategy = BudgetMemRandom()
    strategy.reset(context)
    strategy.apply(list(memory_items(1, 2500)[0].messages), 1024)
    tiers: dict[str, str] = context.info["budgetmem"]["tiers"]
    return tiers


def test_random_control_is_seeded_by_seed_and_item() -> None:
    assert _random_tiers(0, "memory/0001") == _random_tiers(0, "memory/0001")
    draws = [_random_tiers(0, f"memory/{i:04d}") for i in range(12)]
    assert len({json.dumps(d, sort_keys=True) for d in draws}) > 1
    assert {t for d in draws for t in d.values()} == {"LOW", "MID", "HIGH"}
    other_seed = [_random_tiers(1, f"memory/{i:04d}") for i in range(12)]
    assert other_seed != draws


# -- helpers -----------------------------------------------------------------------------------
def test_question_and_final_extraction() -> None:
    prompt = "Based on the above context ...\n\nQuestion: When did Mel paint? Short answer:"
    assert question_of(prompt) == "When did Mel paint?"
    assert question_of("What is my dog called?") == "What is my dog called?"
    assert extract_final("thinking... final: May 2023") == "May 2023"
    assert extract_final("just this") == "just this"


# -- names: the router pattern -----------------------------------------------------------------
def test_router_names_resolve_to_one_class_per_lambda() -> None:
    cls = REGISTRY.resolve("budgetmem@0.10")
    assert issubclass(cls, BudgetMemRouter)
    assert cls.name == "budgetmem@0.1"
    assert REGISTRY.resolve("budgetmem@0.1") is cls
    assert REGISTRY.resolve("budgetmem@1").name == "budgetmem@1"
    with pytest.raises(ConfigError, match="non-negative number"):
        REGISTRY.resolve("budgetmem@fast")
    with pytest.raises(ConfigError, match=r"budgetmem@<\.\.\.>"):
        REGISTRY.resolve("budgetmem_turbo")


def test_missing_checkpoint_names_the_path_and_the_command(tmp_path: Path) -> None:
    strategy = load_strategy("budgetmem@0.5")
    tokens = ApproxCounter()
    strategy.reset(_context(tokens, recording_aux(tokens), budgetmem_router_dir=str(tmp_path)))
    with pytest.raises(ConfigError) as caught:
        strategy.apply(list(memory_items(1, 2500)[0].messages), 1024)
    message = str(caught.value)
    assert str(checkpoint_path(tmp_path, "0.5")) in message
    assert "budgetbench train-router --lambda 0.5" in message
    assert "\n" not in message


# -- the LoCoMo split --------------------------------------------------------------------------
def test_locomo_split_selects_conversations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    first = locomo_samples()[0]
    second = copy.deepcopy(first)
    second["sample_id"] = "conv-other"
    path = write_json(tmp_path / "locomo10.json", [first, second])

    def ids(**extra: str) -> set[str]:
        task = LoCoMoTask(TaskOptions(data_path=path, extra=extra))
        return {item.item_id.split("/")[0] for item in task.load()}

    assert ids() == {"conv-fixture", "conv-other"}
    assert ids(locomo_samples="first") == {"conv-fixture"}
    assert ids(locomo_samples="rest") == {"conv-other"}
    assert ids(locomo_samples="conv-other") == {"conv-other"}
    monkeypatch.setenv("BUDGETBENCH_LOCOMO_SAMPLES", "rest")  # read by the option, not here
    assert ids() == {"conv-fixture", "conv-other"}
    with pytest.raises(ConfigError, match="unknown sample ids conv-9"):
        ids(locomo_samples="conv-9")


# -- imports stay cheap ------------------------------------------------------------------------
def test_budgetmem_and_the_cli_import_no_torch() -> None:
    code = (
        "import sys\n"
        "import pytest_budgetbench.strategies.budgetmem.strategy\n"
        "import pytest_budgetbench.strategies.budgetmem.router\n"
        "from pytest_budgetbench.commands.cli import build_parser\n"
        "build_parser()\n"
        "heavy = {'torch', 'numpy', 'transformers', 'sentence_transformers', 'pandas'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_router_without_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_budgetbench.errors import MissingDependency
    from pytest_budgetbench.strategies.budgetmem.router import policy_class

    # None in sys.modules makes the import fail as if torch were not installed.
    monkeypatch.setitem(sys.modules, "pytest_budgetbench.strategies.budgetmem.policy", None)
    with pytest.raises(MissingDependency, match=r"pytest-budgetbench\[budgetmem\]"):
        policy_class()
