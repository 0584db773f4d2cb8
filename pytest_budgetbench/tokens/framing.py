"""When a chat template lets a prompt's token count be added up from its messages.

A prompt's count is often its template's *framing* (a BOS token, a default system prompt
injected when there is none, the generation prompt) plus what each message adds. Where
that holds, a counter can count a prompt from the per-message counts it has cached
instead of rendering and tokenizing the whole prompt again. It holds for ChatML-style
templates, which wrap every message in special tokens, but not for every template: some
merge consecutive tool results into one turn (Qwen2.5), fold the system prompt into the
first user turn, refuse roles out of alternation, or let text on either side of a message
boundary merge into one token.

So it is never assumed. :func:`verify_additivity` counts a fixed set of probe prompts both
ways, whole and as a sum of per-message counts, and keeps a framing per :class:`Case`
(first role, last role, single message) only where every probe of that case differs from
its sum by the same number. A template that treats the first message specially (Qwen's
and SmolLM2's default system prompt when the first is not ``system``) gets one framing per
first role; one that treats the last specially, one per last role. The probes cover every
role in every position, runs of one role, empty and whitespace-edged text, text that could
merge across a boundary, multi-part content, images and empty part lists. Roles beyond
system/user/assistant (tool, developer) are accepted only if their own probes agree too;
a prompt holding a rejected role, or a message with keys other than role and content, is
counted whole.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import NamedTuple

from pytest_budgetbench.messages import Message

MIN_PROBES = 4
"""A case's framing is kept only if at least this many of its probes showed it."""
CORE_ROLES: tuple[str, ...] = ("system", "user", "assistant")
EXTRA_ROLES: tuple[str, ...] = ("tool", "developer")
_PLAIN_KEYS = frozenset({"role", "content"})

_IMAGE: dict[str, object] = {"type": "image_url",
                              "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
PROBE_CONTENTS: tuple[str | list[dict[str, object]], ...] = (
    "What is my cat called?",
    "",
    " ",
    "\n",
    "a",
    " leading space",
    "trailing space ",
    "ends in a newline\n",
    "\nstarts with a newline",
    "ends in two newlines\n\n",
    "\ttab\t",
    "punctuation at both ends.",
    "!?",
    "12345",
    "Zürich, 東京 🙂",
    "'quoted'",
    '"double"',
    "<|im_end|>",
    "<b>markup</b>",
    "  two  spaces  ",
    [{"type": "text", "text": "first part,"}, {"type": "text", "text": " second part"}],
    [{"type": "text", "text": "Look at this: "}, _IMAGE],
    [_IMAGE],
    [],
)
"""Message contents the probes cycle through (each at the first and last position of every
case): edges where tokens could merge across a boundary, and every content form."""


class Case(NamedTuple):
    """What a template's framing may depend on: the first and last roles, and whether the
    prompt is a single message."""

    first: str
    last: str
    single: bool


def case_of(messages: Sequence[Message]) -> Case:
    return Case(str(messages[0].get("role")), str(messages[-1].get("role")), len(messages) == 1)


@dataclass(frozen=True)
class Additivity:
    """Where a counter may add up per-message counts: the verified framing of each case,
    and the roles whose messages may appear in such a prompt."""

    framings: Mapping[Case, int] = field(default_factory=dict)
    roles: frozenset[str] = frozenset()
    rejected: tuple[str, ...] = ()
    """Why a role or case is counted whole, for a reader (and a test) to see."""

    def framing(self, messages: Sequence[Message]) -> int | None:
        """The template's framing for this prompt, or None if it must be counted whole."""
        if not messages:
            return None
        for message in messages:
            if (message.get("role") not in self.roles or not message.keys() <= _PLAIN_KEYS
                    or not isinstance(message.get("content"), str | list)):
                return None
        return self.framings.get(case_of(messages))


NOT_VERIFIED = Additivity(rejected=("this counter does not verify additivity",))

Count = Callable[[Sequence[Message]], int]


def verify_additivity(whole: Count, per_message: Callable[[Message], int]) -> Additivity:
    """Probe a counter: ``whole`` counts a full prompt, ``per_message`` one message's share.

    A probe whose per-message count fails says nothing (a count that fails falls back to
    the whole count); one whose whole count fails while its sum does not breaks its case,
    since adding up would count a prompt the template refuses.
    """
    framings, broken = _observe(_probes(CORE_ROLES), whole, per_message)
    roles = set(CORE_ROLES)
    rejected = [f"case {tuple(case)} differs between probes" for case in sorted(broken)]
    for role in EXTRA_ROLES:
        found, bad = _observe(_probes((*CORE_ROLES, role), required=role), whole, per_message)
        conflicts = (bad - broken) | {case for case, value in found.items()
                                      if case in framings and framings[case] != value}
        if conflicts:
            rejected.append(f"role {role!r}: probes disagree in {sorted(map(tuple, conflicts))}")
        elif not found:
            rejected.append(f"role {role!r}: no probe could be counted message by message")
        else:
            roles.add(role)
            framings.update({case: value for case, value in found.items()
                             if case not in broken})
    verified = {case: value for case, value in framings.items() if case not in broken}
    if not verified:
        rejected.append("no case verified: every prompt is counted whole")
    return Additivity(verified, frozenset(roles), tuple(rejected))


def _observe(
    probes: Iterator[list[Message]], whole: Count, per_message: Callable[[Message], int]
) -> tuple[dict[Case, int], set[Case]]:
    """The framing each case showed (to at least MIN_PROBES probes), and the cases whose
    probes disagree."""
    framings: dict[Case, int] = {}
    broken: set[Case] = set()
    seen: Counter[Case] = Counter()
    for prompt in probes:
        case = case_of(prompt)
        try:
            summed = sum(per_message(message) for message in prompt)
        except Exception:  # counted whole, which raises, wherever a message cannot be alone
            continue
        try:
            framing = whole(prompt) - summed
        except Exception:  # the template refuses a prompt that a sum would count
            broken.add(case)
            continue
        seen[case] += 1
        if framings.setdefault(case, framing) != framing:
            broken.add(case)
    return {case: value for case, value in framings.items() if seen[case] >= MIN_PROBES}, broken


def _probes(roles: Sequence[str], required: str | None = None) -> Iterator[list[Message]]:
    """Probe prompts over ``roles`` (each holding ``required``, if given): every shape of up
    to three messages and longer ones with runs of one role, in two content variants; every
    content alone, and (for the core roles) at the first and at the last position of each
    two-message case, where framing text meets a message's edges."""
    shapes = [shape for size in (1, 2, 3) for shape in product(roles, repeat=size)]
    runs: tuple[str, ...] = ("user", "user", "assistant", "assistant", "system", "system")
    if required is not None:
        runs = (*runs, required, required)
    shapes += [(first, *runs, last) for first, last in product(roles, repeat=2)]
    contents = PROBE_CONTENTS
    for index, shape in enumerate(shapes):
        if required is not None and required not in shape:
            continue
        for variant in range(2):
            yield [_message(role, contents[(3 * index + 11 * variant + 7 * position)
                                           % len(contents)])
                   for position, role in enumerate(shape)]
        if len(shape) == 1 or (len(shape) == 2 and required is None):
            for offset in range(len(contents)):
                yield [_message(role, contents[(offset + 5 * position) % len(contents)])
                       for position, role in enumerate(shape)]


def _message(role: str, content: str | list[dict[str, object]]) -> Message:
    return {"role": role, "content": content}
