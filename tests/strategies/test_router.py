"""The BudgetMem router: cost normalisation, PPO training (learning, seeding, resuming),
checkpoints, the budgetmem@<lambda> strategy, and ``budgetbench train-router``."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_budgetbench import embeddings  # noqa: E402
from pytest_budgetbench.commands import cli  # noqa: E402
from pytest_budgetbench.commands.train_environment import PipelineEnvironment  # noqa: E402
from pytest_budgetbench.engine.catalog import Catalog  # noqa: E402
from pytest_budgetbench.engine.runner import Runner  # noqa: E402
from pytest_budgetbench.errors import ConfigError  # noqa: E402
from pytest_budgetbench.messages import Message, Tool, text_of  # noqa: E402
from pytest_budgetbench.model.chat import Completion  # noqa: E402
from pytest_budgetbench.model.endpoint import Endpoint  # noqa: E402
from pytest_budgetbench.records.store import RunStore  # noqa: E402
from pytest_budgetbench.settings.config import Settings  # noqa: E402
from pytest_budgetbench.strategies import load_strategy  # noqa: E402
from pytest_budgetbench.strategies.base import StrategyContext  # noqa: E402
from pytest_budgetbench.strategies.budgetmem.policy import Policy  # noqa: E402
from pytest_budgetbench.strategies.budgetmem.ppo import (  # noqa: E402
    CostNormaliser,
    EpisodeResult,
    TrainConfig,
    Trainer,
    episode_order,
    train,
)
from pytest_budgetbench.strategies.budgetmem.router import (  # noqa: E402
    Features,
    Sampler,
    checkpoint_path,
)
from pytest_budgetbench.strategies.budgetmem.tiers import MODULES, Tier  # noqa: E402
from pytest_budgetbench.tasks.memory import MemoryTask  # noqa: E402
from pytest_budgetbench.testing import HashingEmbedder, check_strategy  # noqa: E402
from pytest_budgetbench.tokens.approximate import ApproxCounter  # noqa: E402
from pytest_budgetbench.tokens.base import TokenCounter  # noqa: E402
from tests.fake_openai import FakeOpenAI, reading_responder  # noqa: E402
from tests.strategy_helpers import ScriptedAux, memory_items  # noqa: E402

DIM = 8


# -- cost normalisation ------------------------------------------------------------------------
def test_all_zero_costs_never_divide_by_zero() -> None:
    normaliser = CostNormaliser("tokens", window=4)
    assert [normaliser.efficiency(0.0) for _ in range(6)] == [1.0] * 6
    seconds = CostNormaliser("seconds")
    assert seconds.efficiency(0.0) == 1.0
    assert seconds.scale() == pytest.approx(1e-3)


def test_efficiency_is_robust_to_one_outlier() -> None:
    normaliser = CostNormaliser("tokens", window=20)
    for _ in range(19):
        normaliser.efficiency(100.0)
    normaliser.efficiency(1_000_000.0)
    # The 90th percentile ignores the outlier: a typical cost stays comparable, not ~free.
    assert normaliser.scale() == pytest.approx(100.0)
    assert normaliser.efficiency(50.0) == pytest.approx(0.5)
    assert normaliser.efficiency(float("nan")) == 1.0


def test_episode_order_visits_every_query_each_pass() -> None:
    first = [episode_order(5, 0, e) for e in range(5)]
    second = [episode_order(5, 0, e) for e in range(5, 10)]
    assert sorted(first) == sorted(second) == list(range(5))
    assert first == [episode_order(5, 0, e) for e in range(5)]


# -- PPO on a synthetic environment ------------------------------------------------------------
class ToyEnvironment:
    """Five decisions per episode; the filter scores only at HIGH, every HIGH costs."""

    def __init__(self, size: int = 6) -> None:
        self.meta: dict[str, Any] = {"task": "toy", "embedder": "toy"}
        rng = random.Random(7)
        self.queries = [tuple(rng.uniform(-1, 1) for _ in range(DIM)) for _ in range(size)]

    @property
    def size(self) -> int:
        return len(self.queries)

    @property
    def dim(self) -> int:
        return DIM

    def run(self, index: int, sample: Sampler) -> EpisodeResult:
        query = self.queries[index]
        tiers = {m: sample((query, query, i)) for i, m in enumerate(MODULES)}
        score = 1.0 if tiers["filter"] == Tier.HIGH else 0.0
        cost = 100.0 * sum(t == Tier.HIGH for t in tiers.values())
        return EpisodeResult(score, cost, {m: t.name for m, t in tiers.items()})


def _decisions(policy: Policy, env: ToyEnvironment) -> set[tuple[str, Tier]]:
    return {(m, policy.decide((q, q, i))) for q in env.queries for i, m in enumerate(MODULES)}


def test_ppo_learns_where_the_high_tier_pays(tmp_path: Path) -> None:
    env = ToyEnvironment()
    # One shared reward for five decisions: credit assignment needs a few hundred episodes.
    config = TrainConfig(lam=0.5, episodes=640, batch=16, epochs=6, lr=1e-2, seed=3)
    result = train(env, config, tmp_path, progress=lambda _line: None)
    policy = Policy.load(result.checkpoint)
    decided = _decisions(policy, env)
    assert {t for m, t in decided if m == "filter"} == {Tier.HIGH}
    assert all(t != Tier.HIGH for m, t in decided if m != "filter")
    assert policy.meta["lambda"] == "0.5" and policy.meta["episodes"] == 640


def _weights(path: Path) -> dict[str, Any]:
    return Policy.load(path).net.state_dict()  # type: ignore[no-any-return]


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_training_is_seeded(tmp_path: Path) -> None:
    config = TrainConfig(lam=0.5, episodes=16, batch=8, seed=1)
    first = train(ToyEnvironment(), config, tmp_path / "a", progress=lambda _l: None)
    second = train(ToyEnvironment(), config, tmp_path / "b", progress=lambda _l: None)
    other = train(ToyEnvironment(), TrainConfig(lam=0.5, episodes=16, batch=8, seed=2),
                  tmp_path / "c", progress=lambda _l: None)
    assert _same(_weights(first.checkpoint), _weights(second.checkpoint))
    assert not _same(_weights(first.checkpoint), _weights(other.checkpoint))


def test_training_resumes_where_it_stopped(tmp_path: Path) -> None:
    straight = train(ToyEnvironment(), TrainConfig(lam=0.5, episodes=24, batch=8, seed=1),
                     tmp_path / "straight", progress=lambda _l: None)
    lines: list[str] = []
    train(ToyEnvironment(), TrainConfig(lam=0.5, episodes=8, batch=8, seed=1),
          tmp_path / "resumed", progress=lines.append)
    resumed = train(ToyEnvironment(), TrainConfig(lam=0.5, episodes=24, batch=8, seed=1),
                    tmp_path / "resumed", progress=lines.append)
    assert any("resuming" in line and "episode 8" in line for line in lines)
    assert resumed.episodes == 24
    assert _same(_weights(straight.checkpoint), _weights(resumed.checkpoint))
    log = (tmp_path / "resumed" / "budgetmem-lambda0.5.log.jsonl").read_text().splitlines()
    assert [json.loads(line)["episode"] for line in log] == list(range(24))


def test_resume_refuses_another_lambda_state(tmp_path: Path) -> None:
    config = TrainConfig(lam=0.5, episodes=8, batch=8)
    train(ToyEnvironment(), config, tmp_path, progress=lambda _l: None)
    state = tmp_path / "budgetmem-lambda0.5.state.pt"
    saved = torch.load(state, weights_only=True)
    saved["lambda"] = "0.2"
    torch.save(saved, state)
    with pytest.raises(ConfigError, match="--fresh"):
        Trainer(ToyEnvironment(), config, tmp_path, progress=lambda _l: None)


def test_checkpoint_is_small_and_checks_dimensions(tmp_path: Path) -> None:
    policy = Policy.new(384, seed=0, meta={"embedder": "all-MiniLM-L6-v2"})
    path = tmp_path / "budgetmem-lambda0.1.pt"
    policy.save(path)
    assert path.stat().st_size < 400_000
    row: Features = ((0.0,) * 64, (0.0,) * 64, 0)
    with pytest.raises(ConfigError, match="expects 384-dimensional"):
        Policy.load(path).decide(row)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="cannot read router checkpoint"):
        Policy.load(tmp_path / "junk.pt")


# -- the pipeline as an environment, and the router strategy -----------------------------------
class FakeChat:
    """A chat model for the pipeline: answers memory questions like the fake server."""

    base_url = "http://fake"
    model = "fake"

    def __init__(self, tokens: TokenCounter) -> None:
        self.tokens = tokens
        self.calls = 0

    def complete(self, messages: Sequence[Message], *, max_tokens: int,
                 tools: Sequence[Tool] | None = None) -> Completion:
        self.calls += 1
        text = reading_responder([dict(m) for m in messages])
        return Completion(text, self.tokens.count_messages(messages), 3, 0.01)


def _environment(tokens: TokenCounter, run_dir: Path, cost: str = "tokens",
                 chat: FakeChat | None = None) -> PipelineEnvironment:
    """Episodes on three memory items, run by a runner as the command wires one."""
    task = MemoryTask(training_options())
    settings = Settings(audit="off")
    catalog = Catalog(settings)
    catalog.provide(task, task.load()[:3])
    runner = Runner(settings, catalog, Endpoint("http://fake", "fake"), RunStore(run_dir),
                    "train", tokens=tokens, chat=chat or FakeChat(tokens),
                    embedder_factory=HashingEmbedder)
    return PipelineEnvironment(runner=runner, task=task.name, items=catalog.items(task.name),
                               embedder_factory=HashingEmbedder, budget=900, cost=cost,
                               meta={"embedder": "hashing-64"})


def training_options() -> Any:
    from pytest_budgetbench.tasks import TaskOptions

    return TaskOptions(items=3, extra={"history_tokens": 1500})


@pytest.fixture(scope="module")
def router_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("routers")
    env = _environment(ApproxCounter(), out / "train-run")
    train(env, TrainConfig(lam=0.1, episodes=6, batch=3, seed=0), out, progress=lambda _l: None)
    return out


def test_pipeline_episodes_are_graded_and_costed(tmp_path: Path) -> None:
    tokens = ApproxCounter()
    env = _environment(tokens, tmp_path)
    high = env.run(0, lambda _row: Tier.HIGH)
    low = env.run(0, lambda _row: Tier.LOW)
    assert high.tiers == dict.fromkeys(MODULES, "HIGH")
    assert high.cost > 0 and low.cost == 0.0
    assert low.score == 1.0  # the LOW pipeline keeps the planted fact; the fake reads it
    seconds = _environment(tokens, tmp_path, cost="seconds").run(0, lambda _row: Tier.MID)
    assert seconds.cost > 0  # heuristic and embedding tiers are not free
    usd = _environment(tokens, tmp_path, cost="usd")
    usd.prices = (1e6, 0.0)  # a dollar per input token: the cost is the aux input tokens
    rows = RunStore(tmp_path).rows()
    assert usd.run(0, lambda _row: Tier.HIGH).cost == rows[0]["aux_input_tokens"] > 0


def test_episodes_run_as_the_runners_cells(tmp_path: Path) -> None:
    """Each episode is a recorded cell: the runner counts, enforces and records it."""
    env = _environment(ApproxCounter(), tmp_path)
    env.run(1, lambda _row: Tier.HIGH)
    (row,) = RunStore(tmp_path).rows()
    assert row["status"] == "ok" and row["strategy"] == "budgetmem_training"
    assert row["counted_tokens"] <= row["budget"] == 900
    assert row["item_id"] == env.items[1].item_id and row["aux_input_tokens"] > 0


def test_a_failing_episode_is_a_strategy_error_with_its_row(tmp_path: Path) -> None:
    """A sampler that breaks fails the episode the way a sweep's strategy fails a cell."""
    from pytest_budgetbench.errors import StrategyError

    def broken(_row: Features) -> Tier:
        raise RuntimeError("no tier")

    env = _environment(ApproxCounter(), tmp_path)
    with pytest.raises(StrategyError, match=r"budgetmem_training.*RuntimeError: no tier"):
        env.run(0, broken)
    (row,) = RunStore(tmp_path).rows()
    assert row["status"] == "error" and "no tier" in row["error"]


def test_router_strategy_conforms(router_dir: Path) -> None:
    def context(tokens: TokenCounter, budget: int) -> StrategyContext:
        from pytest_budgetbench.testing import EchoAuxModel

        return StrategyContext(tokens=tokens, item_id="conformance",
                               aux=EchoAuxModel(tokens, budget), embedder_factory=HashingEmbedder,
                               options={"budgetmem_router_dir": str(router_dir)})

    check_strategy(lambda: load_strategy("budgetmem@0.1"), context_factory=context,
                   max_examples=20)


def test_router_decides_by_argmax_and_records_its_tiers(router_dir: Path) -> None:
    tokens = ApproxCounter()
    strategy = load_strategy("budgetmem@0.1")
    messages = list(memory_items(1, 1500)[0].messages)
    infos = []
    for _ in range(2):
        aux = ScriptedAux(tokens, reply=lambda sent: text_of(sent[-1])[:40])
        context = StrategyContext(tokens=tokens, item_id="memory/0000", aux=aux,
                                  embedder_factory=HashingEmbedder,
                                  options={"budgetmem_router_dir": str(router_dir)})
        strategy.reset(context)
        strategy.apply(messages, 900)
        infos.append(context.info["budgetmem"]["tiers"])
    assert infos[0] == infos[1] and set(infos[0]) == set(MODULES)
    policy = Policy.load(checkpoint_path(router_dir, "0.1"))
    assert policy.meta["episodes"] == 6 and policy.meta["embedder"] == "hashing-64"


# -- the console command -----------------------------------------------------------------------
def test_train_router_help_lists_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["train-router", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for option in ("--lambda", "--episodes", "--cost", "--axis", "--fresh", "--out"):
        assert option in out


def test_train_router_command_trains_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = FakeOpenAI().start()
    monkeypatch.setattr(embeddings, "make_embedder", lambda *_a, **_k: HashingEmbedder())
    argv = ["train-router", "--task", "memory", "--items", "2", "--episodes", "2",
            "--batch", "2", "--budget", "900", "--lambda", "0.25", "--out", str(tmp_path),
            "--endpoint", server.base_url, "--model", "fake-model", "--tokenizer", "approx"]
    try:
        assert cli.main(argv) == 0
        first = capsys.readouterr().out
        assert "episode 2/2" in first and "budgetmem-lambda0.25.pt" in first
        assert (tmp_path / "responses.sqlite").is_file()
        assert len(RunStore(tmp_path / "train-run").rows()) == 2  # one row per episode
        argv[argv.index("--episodes") + 1] = "4"
        assert cli.main(argv) == 0
        second = capsys.readouterr().out
    finally:
        server.stop()
    assert "resuming" in second and "episode 4/4" in second
    assert Policy.load(tmp_path / "budgetmem-lambda0.25.pt").meta["episodes"] == 4


def test_train_router_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train-router", "--episodes", "0"])
    assert exit_info.value.code == 2
    assert "--episodes: must be a positive integer (got '0')" in capsys.readouterr().err
