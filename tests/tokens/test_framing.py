"""Counting a prompt from its messages' cached counts: verified per tokenizer, exact where
used, and the whole count wherever a template does not allow it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_budgetbench.messages import Message
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.framing import Case, verify_additivity
from pytest_budgetbench.tokens.gguf import GGUFCounter
from pytest_budgetbench.tokens.huggingface import HFCounter
from tests.strategy_helpers import load_gguf
from tests.tokens import chat_templates

IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
_PIECE = st.one_of(
    st.sampled_from(list("abc xyz .,?!\n\t'\"-<>|:")),
    st.sampled_from(["ü", "東", "🙂", "ß", "é"]),
    # Marker text of the templates, and runs that could merge across a boundary.
    st.sampled_from(["<|im_start|>", "<|im_end|>", "<|eot_id|>", "[INST]", "\n\n", "  ",
                     "hello", " world"]),
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Co")),
)
_TEXT = st.lists(_PIECE, max_size=12).map("".join)
_CONTENT = st.one_of(
    _TEXT, _TEXT, _TEXT,
    st.lists(st.one_of(st.builds(lambda text: {"type": "text", "text": text}, _TEXT),
                       st.just(IMAGE_PART)), max_size=3),
)
_MESSAGE = st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]),
    "content": _CONTENT,
})
CHATS = st.lists(_MESSAGE, min_size=1, max_size=7)


def _attempt_whole(counter: TokenCounter, messages: Sequence[Message]) -> int | None:
    try:
        return counter.count_whole(messages)
    except Exception:  # the template refuses this prompt: the whole count raises
        return None


def check_additive_where_claimed(counter: TokenCounter, messages: list[Message]) -> None:
    """Where the counter says a prompt is additive, framing + message counts == whole;
    and count_messages is the whole count whichever way it goes."""
    whole = _attempt_whole(counter, messages)
    framing = counter.framing(messages)
    if framing is not None:
        try:
            summed: int | None = framing + sum(counter.count_message(m) for m in messages)
        except Exception:  # a message that cannot be counted alone: counted whole
            summed = None
        if summed is not None:
            assert summed == whole, (messages, framing)
    if whole is not None:
        assert counter.count_messages(messages) == whole


def _property(counter: TokenCounter) -> None:
    @settings(max_examples=80, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(messages=CHATS)
    def run(messages: list[Message]) -> None:
        check_additive_where_claimed(counter, messages)

    run()


# -- the counters under test -------------------------------------------------------------
@pytest.fixture(scope="module")
def gguf() -> GGUFCounter:
    return load_gguf()


def with_template(template: str) -> GGUFCounter:
    """The embedded GGUF's vocabulary under another family's chat template."""
    from pytest_budgetbench.embedded_server.models import embedded_gguf_path

    load_gguf()  # skips where llama.cpp or the model is missing
    return GGUFCounter(embedded_gguf_path(), chat_template=template)


@pytest.fixture(scope="module", params=sorted(chat_templates.FOREIGN))
def foreign(request: pytest.FixtureRequest) -> GGUFCounter:
    return with_template(chat_templates.FOREIGN[request.param])


# -- the property, per tokenizer ----------------------------------------------------------
def test_gguf_additive_count_is_the_whole_count(gguf: GGUFCounter) -> None:
    _property(gguf)


def test_foreign_template_additive_count_is_the_whole_count(foreign: GGUFCounter) -> None:
    _property(foreign)


@pytest.mark.parametrize("template", [chat_templates.CHATML, None], ids=["chatml", "none"])
def test_hf_additive_count_is_the_whole_count(tokenizer_json: Path, template: str | None
                                              ) -> None:
    _property(HFCounter(str(tokenizer_json), chat_template=template))


def test_approx_additive_count_is_the_whole_count() -> None:
    _property(ApproxCounter())


# -- what the probes find -----------------------------------------------------------------
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "My cat is called Mochi."},
    {"role": "assistant", "content": "Noted."},
    {"role": "user", "content": "What is my cat called?"},
]


def test_the_embedded_template_counts_chats_from_their_messages(gguf: GGUFCounter) -> None:
    for prompt in (CHAT, CHAT[1:], CHAT[-1:], CHAT[:1]):
        assert gguf.framing(prompt) is not None, prompt
        assert gguf.count_messages(prompt) == gguf.count_whole(prompt)
    # A default system prompt is injected without a leading system message (SmolLM2's and
    # Qwen's templates): its framing is larger, and measured on its own.
    assert gguf.framing(CHAT[1:]) != gguf.framing(CHAT)


def test_an_additive_count_makes_no_tokenizer_call_once_messages_are_cached(
    gguf: GGUFCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = [*CHAT[:-1], {"role": "user", "content": "A question only this test asks?"}]
    gguf.additivity()
    for message in prompt:
        gguf.count_message(message)
    expected = gguf.count_whole(prompt)

    def refuse(messages: Sequence[Message]) -> int:
        raise AssertionError("tokenized the whole prompt")

    monkeypatch.setattr(gguf, "_count_prompt", refuse)
    assert gguf.count_messages(prompt) == expected


def test_consecutive_tool_results_are_counted_whole_under_qwen() -> None:
    counter = with_template(chat_templates.QWEN25)
    prompt = [*CHAT[:3], {"role": "tool", "content": "42"}, {"role": "tool", "content": "43"},
              CHAT[3]]
    assert "tool" not in counter.additivity().roles
    assert counter.framing(prompt) is None
    summed = counter.overhead() + sum(counter.count_message(m) for m in prompt)
    assert summed != counter.count_whole(prompt)  # the merged turn: a sum would be wrong
    assert counter.count_messages(prompt) == counter.count_whole(prompt)
    # Developer messages are not rendered at all, which adds up (to nothing).
    assert counter.framing([*CHAT[:1], {"role": "developer", "content": "x"}, CHAT[3]]) \
        is not None


def test_a_template_that_refuses_sequences_is_never_added_up() -> None:
    mistral = with_template(chat_templates.MISTRAL)
    assert not mistral.additivity().framings
    alternating = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "user", "content": "c"}]
    assert mistral.count_messages(alternating) == mistral.count_whole(alternating)
    with pytest.raises(ValueError, match="alternate"):
        mistral.count_messages([alternating[0], alternating[0]])


def test_text_that_merges_across_boundaries_is_never_added_up() -> None:
    joined = with_template(chat_templates.CONCATENATED)
    assert not joined.additivity().framings
    assert joined.framing([{"role": "user", "content": "a"}]) is None


class TurnCounter(TokenCounter):
    """A template that wraps each run of same-role messages once, as Qwen does tool results:
    one token per word, two per turn, one per prompt."""

    name = "turns"

    def _count_text(self, text: str) -> int:
        return len(text.split())

    def _count_prompt(self, messages: Sequence[Message]) -> int:
        turns = sum(1 for i, m in enumerate(messages)
                    if i == 0 or messages[i - 1]["role"] != m["role"])
        return 1 + 2 * turns + sum(self._count_text(str(m["content"])) for m in messages)


def test_a_sequence_sensitive_counter_is_counted_whole() -> None:
    counter = TurnCounter()
    found = counter.additivity()
    # A single message is one turn, which adds up; no case of two messages or more does.
    assert found.framings and all(case.single for case in found.framings)
    prompt = [{"role": "user", "content": "one two"}, {"role": "user", "content": "three"}]
    assert counter.count_messages(prompt) == 1 + 2 + 3


def test_messages_with_more_than_role_and_content_are_counted_whole() -> None:
    counter = ApproxCounter()
    named = [{"role": "user", "content": "hello", "name": "ann"}]
    assert counter.framing(named) is None
    assert counter.framing([{"role": "user", "content": "hello"}]) is not None
    assert counter.framing([]) is None


def test_verification_keeps_one_framing_per_case() -> None:
    def whole(messages: Sequence[Message]) -> int:  # 5 more when the first is not system
        return (0 if messages[0]["role"] == "system" else 5) + 3 + 2 * len(messages)

    found = verify_additivity(whole, lambda message: 2)
    assert found.framings[Case("system", "user", False)] == 3
    assert found.framings[Case("user", "user", False)] == 8
    assert found.framings[Case("tool", "tool", True)] == 8
    assert found.roles == {"system", "user", "assistant", "tool", "developer"}
