"""Several replicas of one model: least in-flight, per-replica bounds, failover, the cache
key, and the endpoint option that lists them."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.engine.wiring import credential_line
from pytest_budgetbench.errors import ConfigError, EndpointError, EndpointUnavailable
from pytest_budgetbench.model.chat import ChatModel, Completion
from pytest_budgetbench.model.endpoint import Endpoint
from pytest_budgetbench.model.replicas import ReplicaPool
from pytest_budgetbench.settings.config import Settings, endpoint_urls
from pytest_budgetbench.tasks.agent_lookup import LOOKUP_TOOL
from tests.engine.test_episodes import lookup_args
from tests.engine.test_sweep_resilience import rows_in, runs_in
from tests.fake_openai import FakeOpenAI, agent_responder
from tests.settings.test_config import load
from tests.sweeps import rows_of, sweep_args

QUESTION = [{"role": "user", "content": "my dog is called Rex. What is my dog called?"}]
WAIT_S = 10.0
"""A guard against a hang, never a timing assertion."""


class Replica:
    """A stand-in for one replica's ChatModel: each request waits for the test to let it
    go (``hold=True``), then answers with the replica's name or raises ``failure``."""

    def __init__(self, name: str, hold: bool = False) -> None:
        self.name = name
        self.base_url = f"http://user:pw@{name}:8000/v1"
        self.model, self.temperature, self.seed, self.tool_parser = "m", 0.0, 0, "none"
        self.hold = hold
        self.failure: Exception | None = None
        self.entered: queue.Queue[threading.Event] = queue.Queue()
        self.calls = 0
        self.response_formats: list[Any] = []

    @property
    def params(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "seed": self.seed}

    def complete(self, messages: Sequence[Any], *, max_tokens: int,
                 tools: Sequence[Any] | None = None,
                 response_format: Any = None) -> Completion:
        self.calls += 1
        self.response_formats.append(response_format)
        gate = threading.Event()
        self.entered.put(gate)
        if self.hold:
            assert gate.wait(WAIT_S), "the test never let this request go"
        if self.failure is not None:
            raise self.failure
        return Completion(text=self.name, prompt_tokens=1, completion_tokens=1,
                          latency_s=0.0)

    def next_request(self) -> threading.Event:
        """The gate of the next request this replica receives."""
        return self.entered.get(timeout=WAIT_S)


def pool_of(*replicas: Replica, **options: Any) -> ReplicaPool:
    chats: list[ChatModel] = list(replicas)  # type: ignore[arg-type]
    return ReplicaPool(chats, **options)


class Request:
    """One request to ``pool`` in a thread of its own."""

    def __init__(self, pool: ReplicaPool) -> None:
        self.result: list[Any] = []
        self.thread = threading.Thread(target=self._run, args=(pool,), daemon=True)
        self.thread.start()

    def _run(self, pool: ReplicaPool) -> None:
        try:
            self.result.append(pool.complete(QUESTION, max_tokens=4))
        except Exception as exc:  # the test reads it
            self.result.append(exc)

    def answer(self) -> Any:
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the request never ended"
        return self.result[0]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- choosing a replica ---------------------------------------------------------------------
def test_a_request_goes_to_the_replica_with_the_fewest_requests_in_flight() -> None:
    a, b, c = Replica("a", hold=True), Replica("b", hold=True), Replica("c", hold=True)
    pool = pool_of(a, b, c, per_replica=2)
    started: list[tuple[Request, threading.Event]] = []
    for replica in (a, b, c, a):  # ties go in turn: a, b, c, then a again
        request = Request(pool)
        started.append((request, replica.next_request()))
    (_, a_first), (_, b_gate), (at_c, c_gate), (_, a_second) = started
    c_gate.set()  # c is down to none in flight, a has two and b one; b would be next in turn
    assert at_c.answer().text == "c"
    fifth = Request(pool)
    c.next_request().set()
    assert fifth.answer().text == "c"
    for gate in (a_first, b_gate, a_second):
        gate.set()


def test_no_replica_takes_more_than_its_bound_a_request_waits_for_a_free_one() -> None:
    a, b = Replica("a", hold=True), Replica("b", hold=True)
    pool = pool_of(a, b, per_replica=1)
    Request(pool), Request(pool)
    held = {"a": a.next_request(), "b": b.next_request()}
    third = Request(pool)
    third.thread.join(0.2)
    assert third.thread.is_alive() and a.entered.empty() and b.entered.empty()
    held["b"].set()
    b.next_request().set()  # the waiting request went to the replica that freed up
    assert third.answer().text == "b"
    held["a"].set()


def test_ties_go_round_and_a_worker_starts_at_its_own_replica() -> None:
    replicas = [Replica(name) for name in "abc"]
    pool = pool_of(*replicas, first=5)  # gw5 of an xdist run: 5 % 3 is c
    unrelated = [[{"role": "user", "content": f"Question {n}?"}] for n in range(4)]
    answers = [pool.complete(prompt, max_tokens=4).text for prompt in unrelated]
    assert answers == ["c", "a", "b", "c"]


def test_an_episodes_calls_stay_at_the_replica_that_holds_their_start() -> None:
    """Each call of an episode repeats the previous one's prompt and adds to it: it goes
    where that prompt went (the server holds it), while another episode, unrelated, goes
    round to the other replica."""
    a, b = Replica("a"), Replica("b")
    pool = pool_of(a, b)
    first = [{"role": "user", "content": "Look up R1."}]
    other = [{"role": "user", "content": "Look up R7."}]
    assert pool.complete(first, max_tokens=4).text == "a"
    assert pool.complete(other, max_tokens=4).text == "b"  # in turn: nothing shared
    call = {"role": "assistant", "content": "lookup R1"}
    for step in range(3):
        first = [*first, call, {"role": "user", "content": f"result {step}"}]
        other = [*other, call, {"role": "user", "content": f"result {step}"}]
        assert pool.complete(first, max_tokens=4).text == "a"
        assert pool.complete(other, max_tokens=4).text == "b"


def test_a_free_replica_wins_over_a_busy_one_that_holds_the_start() -> None:
    a, b = Replica("a", hold=True), Replica("b")
    pool = pool_of(a, b)
    prompt = [{"role": "user", "content": "Look up R1."}]
    held = Request(pool)
    gate = a.next_request()
    assert pool.complete([*prompt, {"role": "assistant", "content": "x"}],
                         max_tokens=4).text == "b"  # a holds its start but is busy
    gate.set()
    assert held.answer().text == "a"


# -- failover -------------------------------------------------------------------------------
def unavailable(name: str) -> EndpointUnavailable:
    return EndpointUnavailable(f"model endpoint http://{name}:8000/v1 failed after 3 "
                               "attempt(s): APIConnectionError: Connection refused")


def test_a_failing_replica_is_taken_out_and_its_requests_answered_by_the_others() -> None:
    a, b = Replica("a"), Replica("b")
    a.failure = unavailable("a")
    events: list[dict[str, Any]] = []
    clock = Clock()
    pool = pool_of(a, b, on_event=events.append, cooldown_s=30, clock=clock)
    assert [pool.complete(QUESTION, max_tokens=4).text for _ in range(5)] == ["b"] * 5
    assert a.calls == 1  # tried once, then left out for its cool-down
    assert pool.out == ["http://a:8000/v1"]
    (event,) = events
    assert event["event"] == "out" and event["replica"] == "http://a:8000/v1"
    assert event["cooldown_s"] == 30 and "Connection refused" in event["error"]
    assert "pw" not in json.dumps(events)

    clock.now += 31  # back in line after its cool-down; still down: out for twice as long
    assert pool.complete(QUESTION, max_tokens=4).text == "b"
    assert a.calls == 2 and events[-1]["cooldown_s"] == 60
    clock.now += 61
    a.failure = None  # up again: its next request brings it back
    assert {pool.complete(QUESTION, max_tokens=4).text for _ in range(2)} == {"a", "b"}
    assert events[-1] == {"event": "back", "replica": "http://a:8000/v1"}
    assert pool.out == []


def test_the_pool_sends_a_requests_response_format_to_the_replica_that_answers() -> None:
    a, b = Replica("a"), Replica("b")
    wanted = {"type": "json_object", "schema": {"type": "object"}}
    pool_of(a, b).complete(QUESTION, max_tokens=4, response_format=wanted)
    assert [*a.response_formats, *b.response_formats] == [wanted]


def test_structured_output_probes_one_replica_and_takes_none_out(
        replicas: list[FakeOpenAI], tmp_path: Path) -> None:
    """llama-cpp-python answers a form it does not take with a 500: the probe must learn
    the form from it without the pool reading the 500 as the replica being down."""
    from pytest_budgetbench.engine.wiring import make_chat, structured_output

    for server in replicas:  # both act as llama-cpp-python's server
        server.response_formats, server.reject_status = {"json_object"}, 500
    urls = ",".join(server.base_url for server in replicas)
    settings = load(cli={"endpoint": urls, "model": replicas[0].model, "retries": 1,
                         "structured_output": "auto"})
    endpoint = Endpoint(base_url=replicas[0].base_url, model=replicas[0].model,
                        replicas=settings.replicas)
    pool = make_chat(settings, endpoint, response_store=None, slots_dir=tmp_path / "slots")
    assert isinstance(pool, ReplicaPool)
    assert structured_output(settings, endpoint, pool, None).form == "json_object"
    assert pool.out == []
    assert len(replicas[0].requests) == 2 and replicas[1].requests == []


def test_a_failure_of_the_request_itself_is_raised_and_takes_no_replica_out() -> None:
    a, b = Replica("a"), Replica("b")
    a.failure = EndpointError("model endpoint http://a:8000/v1 failed after 1 attempt(s): "
                              "BadRequestError: the prompt is longer than the context")
    pool = pool_of(a, b)
    with pytest.raises(EndpointError, match="longer than the context"):
        pool.complete(QUESTION, max_tokens=4)
    assert b.calls == 0 and pool.out == []


def test_a_reply_malformed_at_every_replica_is_the_models_and_takes_no_replica_out(
        replicas: list[FakeOpenAI]) -> None:
    """Two calls sharing one id, from every replica: the model's reply, not a replica's
    fault, so the request errors as with one endpoint and the pool stays whole."""
    events: list[dict[str, Any]] = []
    pool = ReplicaPool([ChatModel(server.base_url, server.model, attempts=1)
                        for server in replicas], on_event=events.append)
    for server in replicas:
        server.inject(1.0, ("duplicate_ids",))
    with pytest.raises(EndpointError, match=r"no replica of model 'fake-model' gave a usable "
                       r"reply to this request \(2 tried; every one replied malformed.*the "
                       r"last: malformed reply from .*share id 'call_dup'"):
        pool.complete(QUESTION, max_tokens=4, tools=[LOOKUP_TOOL])
    assert [len(server.requests) for server in replicas] == [1, 1]
    assert events == [] and pool.out == []


def test_when_every_replica_fails_the_request_is_an_error_never_an_answer() -> None:
    a, b = Replica("a"), Replica("b")
    a.failure, b.failure = unavailable("a"), unavailable("b")
    clock = Clock()
    pool = pool_of(a, b, clock=clock)
    with pytest.raises(EndpointUnavailable, match="every replica of model 'm' failed this "
                       r"request \(2 of 2\); the last: .*http://b:8000/v1"):
        pool.complete(QUESTION, max_tokens=4)
    # Both out: a request still goes to the one back first, then to the other, as one
    # endpoint would still be tried.
    clock.now += 1
    b.failure = None
    assert pool.complete(QUESTION, max_tokens=4).text == "b"
    assert (a.calls, b.calls) == (2, 2)


def test_a_pool_needs_replicas_of_one_model_with_one_set_of_parameters() -> None:
    a, b = Replica("a"), Replica("b")
    b.model = "other"
    with pytest.raises(ValueError, match="one model"):
        pool_of(a, b)


# -- the endpoint, its option, its identity -------------------------------------------------
def test_the_endpoint_option_takes_a_comma_separated_list_of_replicas() -> None:
    settings = load(cli={"endpoint": "http://a:1/v1, http://b:2/v1?key=x,y,http://c:3/v1"})
    assert settings.endpoint == "http://a:1/v1"
    assert settings.replicas == ("http://a:1/v1", "http://b:2/v1?key=x,y", "http://c:3/v1")
    assert settings.parallel_cells == 3
    assert load(cli={"endpoint": "http://a:1/v1", "concurrency": "4"}).parallel_cells == 4
    one = load(ini={"budgetbench_endpoint": "http://a:1/v1"})
    assert (one.endpoint, one.replicas) == ("http://a:1/v1", ())


@pytest.mark.parametrize(("raw", "says"), [
    ("localhost:8000/v1", "must be http(s) URLs, comma-separated"),
    ("http://a:1/v1,ftp://b/v1", "(got 'ftp://b/v1')"),
    ("http://u:hunter2secret@a:1/v1,localhost:8000/v1", "(got 'localhost:8000/v1')"),
    ("http://a:1/v1,http://a:1/v1", "lists http://a:1/v1 twice"),
    ("http://u:hunter2secret@h:1/v1,http://u:hunter2secret@h:1/v1", "lists http://h:1/v1 twice"),
])
def test_a_bad_endpoint_list_is_one_line_naming_the_entry(raw: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        endpoint_urls(raw)
    assert says in str(info.value) and "hunter2secret" not in str(info.value)


def test_a_pools_identity_is_its_model_whatever_its_replicas_and_their_order() -> None:
    pool = Endpoint(base_url="http://a/v1", model="qwen",
                    replicas=("http://a/v1", "http://u:secret-pw@b/v1"))
    moved = Endpoint(base_url="http://c/v1", model="qwen", replicas=("http://c/v1",
                                                                    "http://a/v1"))
    assert pool.identity == moved.identity == "replicas:qwen"
    assert Endpoint(base_url="http://a/v1", model="qwen").identity == "http://a/v1"
    assert pool.label == "http://a/v1,http://b/v1"
    assert "secret-pw" not in repr(pool)


def test_settings_record_the_replicas_without_secrets() -> None:
    settings = Settings(endpoint="http://a/v1",
                        replicas=("http://a/v1", "http://u:secret-pw@b/v1?key=k"))
    assert settings.public()["replicas"] == ["http://a/v1", "http://b/v1"]


def test_the_credential_line_names_each_replica_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    line = credential_line(load(cli={
        "endpoint": "http://a/v1,http://b/v1,http://u:secret-pw@c/v1"}))
    assert line == ("budgetbench: credential for http://a/v1, http://b/v1: none "
                    "($OPENAI_API_KEY is not set); for http://c/v1: the URL's user info, "
                    "as Basic auth ($OPENAI_API_KEY is not set)")


# -- sweeps against fake replicas on loopback -----------------------------------------------
@pytest.fixture
def replicas() -> Iterator[list[FakeOpenAI]]:
    servers = [FakeOpenAI().start() for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


def pool_sweep(pytester: pytest.Pytester, servers: list[FakeOpenAI], tmp: Path,
               *extra: str, run: Callable[..., pytest.RunResult] | None = None
               ) -> pytest.RunResult:
    urls = ",".join(server.base_url for server in servers)
    args = sweep_args(servers[0], tmp, "--budgets=1024", "--budgetbench-strategies=truncation",
                      "--budgetbench-items=8", f"--budgetbench-endpoint={urls}", *extra)
    return (run or pytester.runpytest)(*args)


def test_a_sweep_spreads_its_requests_over_the_replicas_within_each_ones_bound(
    pytester: pytest.Pytester, replicas: list[FakeOpenAI], tmp_path: Path
) -> None:
    for server in replicas:
        server.latency_s = 0.1
    result = pool_sweep(pytester, replicas, tmp_path, "--budgetbench-concurrency=2")
    result.assert_outcomes(passed=8)
    assert [len(server.requests) > 0 for server in replicas] == [True, True]
    assert sum(len(server.requests) for server in replicas) == 8
    assert max(server.max_in_flight for server in replicas) == 2
    rows = rows_in(runs_in(tmp_path)[0])
    assert {row["endpoint"] for row in rows} == {
        f"{replicas[0].base_url},{replicas[1].base_url}"}


def test_a_replica_that_fails_is_taken_out_and_every_cell_is_answered_by_the_other(
    pytester: pytest.Pytester, replicas: list[FakeOpenAI], tmp_path: Path
) -> None:
    down = replicas[1]
    down.inject(1.0, ("500",))
    result = pool_sweep(pytester, replicas, tmp_path, "--budgetbench-retries=1")
    result.assert_outcomes(passed=8)
    assert len(down.requests) == 1  # then out for its cool-down
    (run,) = runs_in(tmp_path)
    assert {row["status"] for row in rows_in(run)} == {"ok"}
    (event,) = [json.loads(line) for line in (run / "replicas.jsonl").read_text().splitlines()]
    assert event["event"] == "out" and event["replica"] == down.base_url
    result.stdout.fnmatch_lines([f"budgetbench: replica {down.base_url} was taken out 1 "
                                 "time(s) and its requests sent to the others; the last "
                                 "failure: *InternalServerError*"])


def test_a_replica_that_answers_200_with_a_malformed_body_is_taken_out_for_the_other(
    pytester: pytest.Pytester, replicas: list[FakeOpenAI], tmp_path: Path
) -> None:
    """Its reply cannot be parsed where the other replica's can: that replica's fault, as
    a 5xx is. With one endpoint the same reply errors its cell (test_model)."""
    bad = replicas[1]
    bad.inject(1.0, ("malformed",))
    result = pool_sweep(pytester, replicas, tmp_path, "--budgetbench-items=6")
    result.assert_outcomes(passed=6)
    # Out once the other's reply is usable: until then each cell in flight (two, one a
    # replica) may meet it once.
    assert 1 <= len(bad.requests) <= 2
    (run,) = runs_in(tmp_path)
    assert {row["status"] for row in rows_in(run)} == {"ok"}
    (event,) = [json.loads(line) for line in (run / "replicas.jsonl").read_text().splitlines()]
    assert event["event"] == "out" and event["replica"] == bad.base_url
    assert event["error"].startswith(f"malformed reply from {bad.base_url}: ")
    result.stdout.fnmatch_lines([f"budgetbench: replica {bad.base_url} was taken out 1 "
                                 "time(s) and its requests sent to the others; the last "
                                 "failure: malformed reply from *"])


def test_agent_episodes_go_on_at_the_other_replica_when_one_answers_malformed(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    servers = [FakeOpenAI(responder=agent_responder).start() for _ in range(2)]
    try:
        servers[0].inject(1.0, ("malformed",))
        urls = ",".join(server.base_url for server in servers)
        result = pytester.runpytest(*lookup_args(
            servers[0], tmp_path, "--budgets=8192", "--budgetbench-strategies=full_context",
            f"--budgetbench-endpoint={urls}"))
    finally:
        for server in servers:
            server.stop()
    result.assert_outcomes(passed=2)
    assert [(row["status"], row["calls"], row["quality"]) for row in rows_of(tmp_path)] == [
        ("ok", 5, 1.0)] * 2
    assert 1 <= len(servers[0].requests) <= 2  # two episodes in flight, as above
    events = (runs_in(tmp_path)[0] / "replicas.jsonl").read_text().splitlines()
    assert [json.loads(line)["replica"] for line in events] == [servers[0].base_url]


def test_when_every_replica_fails_the_cells_are_errors_not_graded_answers(
    pytester: pytest.Pytester, replicas: list[FakeOpenAI], tmp_path: Path
) -> None:
    for server in replicas:
        server.inject(1.0, ("500",))
    result = pool_sweep(pytester, replicas, tmp_path, "--budgetbench-retries=1",
                        "--budgetbench-items=2")
    result.assert_outcomes(errors=2)
    rows = rows_in(runs_in(tmp_path)[0])
    assert {row["status"] for row in rows} == {"error"}
    assert all(row["quality"] is None for row in rows)
    assert "every replica of model 'fake-model' failed" in rows[0]["error"]


def test_the_cache_serves_a_pool_whichever_replicas_answer_and_in_any_order(
    pytester: pytest.Pytester, replicas: list[FakeOpenAI], tmp_path: Path
) -> None:
    pool_sweep(pytester, replicas, tmp_path).assert_outcomes(passed=8)
    sent = [len(server.requests) for server in replicas]
    third = FakeOpenAI().start()
    try:
        pool_sweep(pytester, [third, replicas[1]], tmp_path).assert_outcomes(passed=8)
    finally:
        third.stop()
    assert [len(server.requests) for server in replicas] == sent and not third.requests
    second = rows_in(runs_in(tmp_path)[1])
    assert all(row["cached"] for row in second)


def test_a_replica_that_serves_another_model_is_refused_before_any_cell(
    pytester: pytest.Pytester, replicas: list[FakeOpenAI], tmp_path: Path
) -> None:
    replicas[1].model = "other-model"
    result = pool_sweep(pytester, replicas, tmp_path)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*replica {replicas[1].base_url} does not serve model "
                                 "'fake-model' (it lists 'other-model')*"])
    assert not replicas[0].requests and not replicas[1].requests


def test_under_xdist_the_bound_of_each_replica_holds_across_workers(
    pytester: pytest.Pytester, replicas: list[FakeOpenAI], tmp_path: Path
) -> None:
    for server in replicas:
        server.latency_s = 0.2
    result = pool_sweep(pytester, replicas, tmp_path, "--budgetbench-concurrency=1",
                        "-n", "3", run=pytester.runpytest_subprocess)
    result.assert_outcomes(passed=8)
    assert [server.max_in_flight for server in replicas] == [1, 1]
    assert sum(len(server.requests) for server in replicas) == 8


def test_the_ini_lists_replicas_separated_by_spaces(
    pytester: pytest.Pytester, replicas: list[FakeOpenAI], tmp_path: Path
) -> None:
    pytester.makeini(f"""
        [pytest]
        budgetbench_endpoint = {replicas[0].base_url} {replicas[1].base_url}
        """)
    args = [arg for arg in sweep_args(replicas[0], tmp_path, "--budgets=1024",
                                      "--budgetbench-items=2")
            if not arg.startswith("--budgetbench-endpoint")]
    pytester.runpytest(*args).assert_outcomes(passed=2, xfailed=2)
    rows = rows_in(runs_in(tmp_path)[0])
    assert {row["endpoint"] for row in rows} == {
        f"{replicas[0].base_url},{replicas[1].base_url}"}
