"""Canonical JSON and its sha256: one text, so one digest, for equal values whatever the
order of their keys.

The digests made here are content addresses that outlive the process: response-cache keys,
token-count keys, item digests in run.json. Each caller passes the ``json.dumps`` options
its digest has always used (``ensure_ascii``, ``separators``, ``default``), since a change
to any of them changes every digest, and with it every cache entry and every resume check::

    >>> json_sha256({"b": 1, "a": "é"}) == json_sha256({"a": "é", "b": 1})
    True
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any


def canonical_json(value: Any, *, ensure_ascii: bool = False,
                   separators: tuple[str, str] | None = None,
                   default: Callable[[Any], Any] | None = None) -> str:
    """``value`` as JSON with its keys sorted (``json.dumps`` options as named)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=ensure_ascii, separators=separators,
                      default=default)


def json_sha256(value: Any, *, ensure_ascii: bool = False,
                separators: tuple[str, str] | None = None,
                default: Callable[[Any], Any] | None = None) -> str:
    """The sha256 (hex) of :func:`canonical_json` of ``value``, encoded as UTF-8."""
    text = canonical_json(value, ensure_ascii=ensure_ascii, separators=separators,
                          default=default)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
