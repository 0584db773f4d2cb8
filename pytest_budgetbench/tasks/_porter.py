"""The Porter (1980) stemmer, as in Martin Porter's reference implementation.

LoCoMo's official F1 stems tokens with NLTK's PorterStemmer. NLTK is not a dependency
of this project, so this is a small self-contained implementation of the reference
algorithm (with its "bli"->"ble" and "logi"->"log" departures from the paper). NLTK's
default mode adds a few extensions (irregular forms such as "dying"); those words may
stem differently, which can move a LoCoMo F1 by a token on rare answers.
"""

from __future__ import annotations

_VOWELS = frozenset("aeiou")

_STEP2: tuple[tuple[str, str], ...] = (
    ("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"),
    ("izer", "ize"), ("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"),
    ("ousli", "ous"), ("ization", "ize"), ("ation", "ate"), ("ator", "ate"),
    ("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous"),
    ("aliti", "al"), ("iviti", "ive"), ("biliti", "ble"), ("logi", "log"),
)
_STEP3: tuple[tuple[str, str], ...] = (
    ("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"),
    ("ful", ""), ("ness", ""),
)
_STEP4: tuple[str, ...] = (
    "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent",
    "ion", "ou", "ism", "ate", "iti", "ous", "ive", "ize",
)


def _longest_first(rules: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(rules, key=len, reverse=True))


_STEP2_ORDER = tuple(sorted(_STEP2, key=lambda r: len(r[0]), reverse=True))
_STEP3_ORDER = tuple(sorted(_STEP3, key=lambda r: len(r[0]), reverse=True))
_STEP4_ORDER = _longest_first(_STEP4)


def _consonant(word: str, i: int) -> bool:
    ch = word[i]
    if ch in _VOWELS:
        return False
    if ch == "y":
        # "y" after a consonant acts as a vowel ("happy"); at the start it is a consonant.
        return i == 0 or not _consonant(word, i - 1)
    return True


def _measure(stem: str) -> int:
    """m in [C](VC)^m[V]: how many vowel-consonant sequences the stem has."""
    forms = "".join("c" if _consonant(stem, i) else "v" for i in range(len(stem)))
    collapsed = "".join(ch for i, ch in enumerate(forms) if i == 0 or forms[i - 1] != ch)
    return collapsed.count("vc")


def _has_vowel(stem: str) -> bool:
    return any(not _consonant(stem, i) for i in range(len(stem)))


def _double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and _consonant(word, len(word) - 1)


def _cvc(word: str) -> bool:
    """Ends consonant-vowel-consonant, the last not w, x or y ("hop", not "snow")."""
    if len(word) < 3:
        return False
    n = len(word)
    return (
        _consonant(word, n - 3)
        and not _consonant(word, n - 2)
        and _consonant(word, n - 1)
        and word[-1] not in "wxy"
    )


def _step1a(word: str) -> str:
    if word.endswith("sses"):
        return word[:-2]
    if word.endswith("ies"):
        return word[:-2]
    if word.endswith("ss"):
        return word
    if word.endswith("s"):
        return word[:-1]
    return word


def _step1b(word: str) -> str:
    if word.endswith("eed"):
        return word[:-1] if _measure(word[:-3]) > 0 else word
    for suffix in ("ed", "ing"):
        if word.endswith(suffix) and _has_vowel(word[: -len(suffix)]):
            return _step1b_tidy(word[: -len(suffix)])
    return word


def _step1b_tidy(stem: str) -> str:
    if stem.endswith(("at", "bl", "iz")):
        return stem + "e"
    if _double_consonant(stem) and stem[-1] not in "lsz":
        return stem[:-1]
    if _measure(stem) == 1 and _cvc(stem):
        return stem + "e"
    return stem


def _step1c(word: str) -> str:
    if word.endswith("y") and _has_vowel(word[:-1]):
        return word[:-1] + "i"
    return word


def _replace(word: str, rules: tuple[tuple[str, str], ...], min_measure: int) -> str:
    for suffix, replacement in rules:
        if word.endswith(suffix):
            stem = word[: -len(suffix)]
            return stem + replacement if _measure(stem) > min_measure else word
    return word


def _step4(word: str) -> str:
    for suffix in _STEP4_ORDER:
        if word.endswith(suffix):
            stem = word[: -len(suffix)]
            if suffix == "ion" and not stem.endswith(("s", "t")):
                continue
            return stem if _measure(stem) > 1 else word
    return word


def _step5(word: str) -> str:
    if word.endswith("e"):
        stem = word[:-1]
        m = _measure(stem)
        if m > 1 or (m == 1 and not _cvc(stem)):
            word = stem
    if word.endswith("ll") and _measure(word) > 1:
        word = word[:-1]
    return word


def porter_stem(word: str) -> str:
    """The Porter stem of one lower- or mixed-case word; words of 1-2 letters are kept."""
    word = word.lower()
    if len(word) <= 2:
        return word
    word = _step1c(_step1b(_step1a(word)))
    word = _replace(word, _STEP2_ORDER, 0)
    word = _replace(word, _STEP3_ORDER, 0)
    return _step5(_step4(word))
