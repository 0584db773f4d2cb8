"""ChatModel against the fake server: retries and Retry-After waits, faults, errors that never
leak the key."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Iterator

import pytest

from pytest_budgetbench.errors import EndpointError
from pytest_budgetbench.model import chat as model_module
from pytest_budgetbench.model.chat import (
    ChatModel,
    Completion,
    free_port,
    probe_endpoint,
    retry_after_seconds,
)
from pytest_budgetbench.redact import redact_url
from tests.fake_openai import FakeOpenAI, returning_within

SECRET = "sk-secret-123"
QUESTION = [
    {"role": "system", "content": "Answer from the conversation."},
    {"role": "user", "content": "Please remember this: my dog is called Biscuit."},
    {"role": "assistant", "content": "Noted."},
    {"role": "user", "content": "What is my dog called? Reply with just the name."},
]


@pytest.fixture(scope="module")
def _server() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def fake(_server: FakeOpenAI) -> FakeOpenAI:
    """One server for the module (shutting one down costs half a second), reset per test."""
    _server.faults = []
    _server.requests.clear()
    _server.timeout_s = 3.0
    return _server


def _model(fake: FakeOpenAI, attempts: int = 3, timeout: float = 10.0) -> ChatModel:
    return ChatModel(fake.base_url, fake.model, api_key=SECRET, attempts=attempts,
                     backoff_s=0, timeout=timeout)


def _fails(fake: FakeOpenAI, model: ChatModel) -> EndpointError:
    with pytest.raises(EndpointError) as info:
        model.complete(QUESTION, max_tokens=8)
    message = str(info.value)
    assert fake.base_url in message
    assert SECRET not in message
    return info.value


def test_success_returns_the_answer_and_usage(fake: FakeOpenAI) -> None:
    completion = _model(fake).complete(QUESTION, max_tokens=8)
    assert isinstance(completion, Completion)
    assert completion.text == "Biscuit"
    assert completion.prompt_tokens is not None and completion.prompt_tokens > 0
    assert completion.completion_tokens == 3
    assert completion.latency_s >= 0
    (request,) = fake.requests
    assert request["max_tokens"] == 8
    assert request["model"] == fake.model
    assert request["messages"] == QUESTION


@pytest.mark.parametrize("failures", [1, 2])
def test_500s_are_retried_then_the_answer_returns(
    fake: FakeOpenAI, failures: int
) -> None:
    fake.faults = ["500"] * failures
    completion = _model(fake, attempts=3).complete(QUESTION, max_tokens=8)
    assert completion.text == "Biscuit"
    assert len(fake.requests) == failures + 1


def test_500s_past_the_attempts_raise(fake: FakeOpenAI) -> None:
    fake.faults = ["500"] * 4
    error = _fails(fake, _model(fake, attempts=3))
    assert "3 attempt" in str(error)
    assert len(fake.requests) == 3
    assert fake.faults == ["500"]  # the fourth was never requested


def test_429_with_retry_after_zero_is_retried(fake: FakeOpenAI) -> None:
    fake.faults = ["429", "429"]
    completion = _model(fake, attempts=3).complete(QUESTION, max_tokens=8)
    assert completion.text == "Biscuit"
    assert len(fake.requests) == 3


def test_429_past_the_attempts_raise(fake: FakeOpenAI) -> None:
    fake.faults = ["429"]
    _fails(fake, _model(fake, attempts=1))
    assert len(fake.requests) == 1


def test_timeout_is_retried_then_raises(fake: FakeOpenAI) -> None:
    fake.timeout_s = 1.0
    fake.faults = ["timeout", "timeout"]
    error = _fails(fake, _model(fake, attempts=2, timeout=0.2))
    assert "timed out" in str(error).lower() or "timeout" in str(error).lower()
    assert len(fake.requests) == 2


def test_one_timeout_then_success(fake: FakeOpenAI) -> None:
    fake.timeout_s = 1.0
    fake.faults = ["timeout"]
    completion = _model(fake, attempts=2, timeout=0.2).complete(QUESTION, max_tokens=8)
    assert completion.text == "Biscuit"
    assert len(fake.requests) == 2


def test_a_reply_that_drips_in_past_the_timeout_is_an_error_naming_the_timeout(
    fake: FakeOpenAI,
) -> None:
    fake.faults = ["drip"]  # 600 bytes, one a second: ten minutes, no read ever waits 1 s
    with pytest.raises(EndpointError) as info:
        returning_within(60, lambda: _model(fake, attempts=1, timeout=1.0).complete(
            QUESTION, max_tokens=8))
    message = str(info.value)
    assert "no complete reply within 1 s" in message and "--budgetbench-timeout" in message
    assert SECRET not in message and "Biscuit" not in message


def test_a_dripping_reply_is_retried_and_the_abandoned_request_is_hung_up(
    fake: FakeOpenAI,
) -> None:
    fake.faults = ["drip"]
    model = _model(fake, attempts=2, timeout=1.0)
    completion = returning_within(60, lambda: model.complete(QUESTION, max_tokens=8))
    assert completion.text == "Biscuit" and len(fake.requests) == 2

    def drip_ended() -> None:  # the server's drip stops once the client hung up
        while fake.in_flight:
            time.sleep(0.05)

    returning_within(60, drip_ended)


def test_probe_of_an_endpoint_whose_model_list_drips_gives_up(fake: FakeOpenAI) -> None:
    fake.drip_routes = {"/models"}
    # Bytes well within the per-read timeout: what must end the probe is the whole reply's
    # deadline, not one late byte (a drip as slow as the timeout raced it on a busy machine).
    fake.drip_s = 0.2
    try:
        with pytest.raises(EndpointError) as info:
            returning_within(60, lambda: probe_endpoint(fake.base_url, SECRET, timeout=1.0))
    finally:
        fake.drip_routes = set()
    assert "no complete reply within 1 s" in str(info.value)


@pytest.mark.parametrize("fault", ["malformed", "none"])
def test_malformed_replies_raise_without_retry(fake: FakeOpenAI, fault: str) -> None:
    fake.faults = [fault]
    error = _fails(fake, _model(fake, attempts=3))
    assert "malformed" in str(error)
    assert len(fake.requests) == 1


def test_dropped_connections_raise_after_the_attempts(fake: FakeOpenAI) -> None:
    fake.faults = ["drop", "drop"]
    error = _fails(fake, _model(fake, attempts=2))
    assert "2 attempt" in str(error)
    assert len(fake.requests) == 2


def test_a_dropped_connection_is_retried(fake: FakeOpenAI) -> None:
    fake.faults = ["drop"]
    completion = _model(fake, attempts=2).complete(QUESTION, max_tokens=8)
    assert completion.text == "Biscuit"
    assert len(fake.requests) == 2


def test_mixed_faults_each_count_as_an_attempt(fake: FakeOpenAI) -> None:
    fake.faults = ["500", "429", "drop"]
    completion = _model(fake, attempts=4).complete(QUESTION, max_tokens=8)
    assert completion.text == "Biscuit"
    assert len(fake.requests) == 4


# -- Retry-After ------------------------------------------------------------------------
@pytest.mark.parametrize(("header", "expected"), [
    ("5", 5.0), (" 2.5 ", 2.5), ("-3", 0.0), ("inf", float("inf")),
    ("1e400", float("inf")), ("nan", None), ("soon", None), ("", None), (None, None),
    ("Mon, 01 Jan 10000 00:00:00 GMT", None),
])
def test_retry_after_is_parsed_defensively(header: str | None, expected: float | None) -> None:
    assert retry_after_seconds(header) == expected


def test_retry_after_as_an_http_date_is_seconds_from_now() -> None:
    now = 1_000_000.0
    header = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after_seconds(header, now=now) == pytest.approx(30.0)
    assert retry_after_seconds(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every wait the client asks for, without waiting."""
    asked: list[float] = []
    monkeypatch.setattr(model_module.time, "sleep", asked.append)
    return asked


@pytest.mark.parametrize("header", ["3600", "inf", "1e400"])
def test_a_retry_after_past_the_cap_ends_the_call_instead_of_sleeping(
    fake: FakeOpenAI, sleeps: list[float], header: str
) -> None:
    fake.faults = [f"429:{header}"]
    chat = ChatModel(fake.base_url, fake.model, api_key=SECRET, timeout=5.0, attempts=3)
    with pytest.raises(EndpointError, match="asked to retry after") as info:
        chat.complete(QUESTION, max_tokens=4)
    assert sleeps == [] and "5 s" in str(info.value) and SECRET not in str(info.value)


@pytest.mark.parametrize("header", ["-5", "garbage", "nan", "2"])
def test_odd_retry_after_values_wait_at_most_the_cap_then_answer(
    fake: FakeOpenAI, sleeps: list[float], header: str
) -> None:
    fake.faults = [f"429:{header}"]
    chat = ChatModel(fake.base_url, fake.model, timeout=5.0, attempts=3, max_backoff_s=3.0)
    assert chat.complete(QUESTION, max_tokens=4).text == "Biscuit"
    assert len(sleeps) == 1 and 0.0 <= sleeps[0] <= 3.0


def test_the_exponential_backoff_is_capped_by_the_timeout(
    fake: FakeOpenAI, sleeps: list[float]
) -> None:
    fake.faults = ["500"] * 4
    chat = ChatModel(fake.base_url, fake.model, timeout=0.5, attempts=5, backoff_s=100.0)
    assert chat.complete(QUESTION, max_tokens=4).text == "Biscuit"
    assert len(sleeps) == 4 and max(sleeps) <= 0.5


def test_probe_lists_the_served_model(fake_endpoint: FakeOpenAI) -> None:
    fake_endpoint.model = "served-model-7"
    assert probe_endpoint(fake_endpoint.base_url, SECRET) == ["served-model-7"]
    assert probe_endpoint(fake_endpoint.base_url + "/", None) == ["served-model-7"]


def test_probe_of_a_closed_port_raises_with_a_hint() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EndpointError) as info:
        probe_endpoint(url, SECRET, timeout=2.0)
    message = str(info.value)
    assert "check --budgetbench-endpoint" in message
    assert url in message
    assert SECRET not in message


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize("fault", ["500", "malformed", "none"])
def test_a_key_in_the_endpoint_url_stays_out_of_errors(fake: FakeOpenAI, fault: str) -> None:
    url = fake.base_url.replace("http://", f"http://user:{SECRET}@")
    fake.faults = [fault]
    model = ChatModel(url, fake.model, attempts=1, backoff_s=0)
    with pytest.raises(EndpointError) as info:
        model.complete(QUESTION, max_tokens=8)
    assert SECRET not in str(info.value)
    assert redact_url(url) in str(info.value)
    assert len(fake.requests) == 1


def test_a_key_in_the_probed_url_stays_out_of_errors() -> None:
    url = f"http://user:{SECRET}@127.0.0.1:{free_port()}/v1?api-key={SECRET}"
    with pytest.raises(EndpointError) as info:
        probe_endpoint(url, None, timeout=2.0)
    assert SECRET not in str(info.value)


def test_a_server_started_by_a_sweep_dies_with_it_even_on_sigkill() -> None:
    """The embedded server's launcher asks the kernel to end the server with its parent."""
    import os
    import signal
    import subprocess
    import sys
    import time

    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, time\n"
         "from pytest_budgetbench.embedded_server.process import _die_with_parent\n"
         "child = subprocess.Popen(['sleep', '60'], preexec_fn=_die_with_parent)\n"
         "print(child.pid, flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return
        # A killed child stays a zombie until init reaps it; a zombie is dead.
        with open(f"/proc/{child_pid}/stat") as stat:
            if stat.read().split(")")[-1].split()[0] == "Z":
                return
        time.sleep(0.05)
    os.kill(child_pid, signal.SIGKILL)
    raise AssertionError("the child outlived its SIGKILLed parent")


def test_every_client_of_the_process_shares_one_tls_context(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Making a TLS context reads the CA bundle (tens of ms of CPU); a sweep makes a client
    per request in flight, all as its first cells start."""
    import ssl

    from pytest_budgetbench.model import chat as model_module

    contexts: list[object] = []
    real = model_module.http_client_type()

    class Recording(real):  # type: ignore[misc,valid-type]
        def __init__(self, **options: object) -> None:
            contexts.append(options["verify"])
            super().__init__(**options)

    monkeypatch.setattr(model_module, "http_client_type", lambda: Recording)
    first, second = _model(fake), _model(fake)
    first._new_client().close()
    assert len(contexts) == 3 and isinstance(contexts[0], ssl.SSLContext)
    assert all(context is contexts[0] for context in contexts)
    assert second.complete(QUESTION, max_tokens=8).text == "Biscuit"
