"""The one English stop-word list that word-overlap scoring shares.

Retrieval scoring (``strategies._scoring``), BudgetMem's modules and diagnostic graders
each drop these words before they compare texts; a consumer that also drops words of its
own domain (a task's prompt words, say) adds them to this set by name, next to its use.
"""

from __future__ import annotations

import re

_STOPWORD_TEXT = (
    "a an the and or but if then of to in on at by for with about as is are was were be "
    "been being do does did have has had i me my mine we our you your he she it its they "
    "them their this that these those what which who whom when where why how there here "
    "from into over not no yes so than too very can could would should will shall may "
    "might must just also some any all each both up down out off again once only own same "
    "such after before now more most other s t don"
)
STOPWORDS: frozenset[str] = frozenset(_STOPWORD_TEXT.split())

_WORD = re.compile(r"\w+")


def content_words(text: str, *, extra_stopwords: frozenset[str] = frozenset()) -> list[str]:
    """Lower-cased word tokens of ``text`` without stop words (and ``extra_stopwords``)."""
    dropped = STOPWORDS | extra_stopwords if extra_stopwords else STOPWORDS
    return [word for word in _WORD.findall(text.lower()) if word not in dropped]
