"""The one redaction layer: every message, row, report and exception text that leaves the
process passes through :func:`redact`.

What it removes:

- the secret values this run knows (:func:`register_secret`): the API key, and the
  passwords and query values of the endpoints' URLs (:func:`register_url`);
- the user info, query string and fragment of every URL in the text;
- credentials in header- or parameter-like text that servers echo back in error bodies
  (``Authorization: Bearer …``, ``api-key: …``, ``"x-api-key": "…"``, ``api_key=…``) and
  OpenAI-style ``sk-…`` keys.

A :class:`Secret` is a ``str`` whose ``repr`` is ``'***'``, so a key held in an argument,
a local or a dataclass field is not printed by a traceback (pytest's ``-l`` and long
tracebacks ``repr`` them).

This is the bottom layer: it imports nothing of the package and nothing heavy.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import urllib.parse
from typing import Any

MASK = "***"
MIN_SECRET_CHARS = 4
"""Shorter registered values are not masked by value (a 2-letter password would mangle
every word containing it); URLs and headers are still masked by their shape."""


class Secret(str):
    """A secret string: its value for use, ``'***'`` for ``repr``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(MASK)


_lock = threading.Lock()
_secrets: set[str] = set()


MIN_SECRET_LENGTH = 8
"""Shorter values are not masked as free text: a URL's user name "user" or password "pw"
would otherwise be masked in every prompt and row (``"role": "user"``). Where they stand
in a URL or a credential header they are still masked by its shape."""


def register_secret(value: str | None) -> Secret | None:
    """Remember ``value`` as a secret of this process; returns it as a :class:`Secret`."""
    if not value:
        return None
    if len(str(value)) >= MIN_SECRET_LENGTH:
        with _lock:
            _secrets.add(str(value))
    return value if isinstance(value, Secret) else Secret(value)


def register_url(url: str | None) -> None:
    """Remember the password, user name and query values of ``url`` as secrets."""
    if not url:
        return
    try:
        parts = urllib.parse.urlsplit(url)
        candidates = [parts.password, parts.username]
        candidates += [value for _key, value in urllib.parse.parse_qsl(parts.query)]
    except ValueError:  # a malformed URL: its shape is still masked by redact()
        return
    for value in candidates:
        if value:
            register_secret(urllib.parse.unquote(value))
    if parts.username or parts.password:
        # httpx sends user info as Basic auth; a server may echo that header back.
        userinfo = urllib.parse.unquote(f"{parts.username or ''}:{parts.password or ''}")
        register_secret(base64.b64encode(userinfo.encode()).decode())


def known_secrets() -> list[str]:
    """The registered secrets, longest first (so a key that contains another is masked
    whole)."""
    with _lock:
        values = [s for s in _secrets if len(s) >= MIN_SECRET_CHARS]
    return sorted(values, key=len, reverse=True)


def forget_secrets() -> None:
    """For tests: forget every registered secret."""
    with _lock:
        _secrets.clear()


def redact_url(url: str) -> str:
    """A URL fit for records and messages: no user info, no query string, no fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return MASK
    host = parts.netloc.rpartition("@")[2]  # keeps the port and IPv6 brackets
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def split_query(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without its query string, and the query as parameters.

    An endpoint such as ``https://host/v1?key=K`` keeps ``key=K`` on every request (as the
    client's default query parameters) while the path of each route is appended to
    ``https://host/v1``; anywhere else the query is redacted.
    """
    parts = urllib.parse.urlsplit(url)
    params = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    bare = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    return bare, params


def request_target(url: str, api_key: str | None) -> tuple[str, dict[str, str]]:
    """Where an endpoint's requests go, and their query parameters (:func:`split_query`).

    One credential is sent: with an API key, the key (a Bearer token) and never the URL's
    user info, which httpx would otherwise send as Basic auth in the key's place; without
    a key, the user info as Basic auth.
    """
    bare, query = split_query(url)
    parts = urllib.parse.urlsplit(bare)
    if api_key and "@" in parts.netloc:
        host = parts.netloc.rpartition("@")[2]
        bare = urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))
    return bare, query


def has_userinfo(url: str | None) -> bool:
    """``url`` carries ``user:password@`` (or ``user@``)."""
    try:
        return bool(url) and "@" in urllib.parse.urlsplit(url).netloc
    except ValueError:
        return False


# A URL in running text: scheme://, then anything up to white space, quotes or brackets.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>`\\]+")
# Header- or parameter-like credentials: the name and separator stay, the value goes.
_CREDENTIAL = re.compile(
    r"(?i)(\b(?:proxy-)?authorization|\b(?:x-)?api[-_]?key|\bapikey|\baccess[-_]?token"
    r"|\bpassword|\bpasswd|\bsecret[-_]?key)"
    r"(\\?[\"']?\s*[:=]\s*\\?[\"']?\s*)"
    r"(?:(?:bearer|basic|token)\s+)?"
    r"[^\s\"'\\,;&)}\]]+"
)
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=\-]{4,}"
                     # Basic credentials are base64: a digit, + / or = sets them apart
                     # from prose ("basic strategy").
                     r"|\b(basic)\s+(?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/]{8,}={0,2}")
_OPENAI_KEY = re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}")


def _mask_url(match: re.Match[str]) -> str:
    url = match.group(0)
    core = url.rstrip(".,:;)]}")  # the sentence's punctuation, not the URL's
    trailing = url[len(core):]
    try:
        parts = urllib.parse.urlsplit(core)
    except ValueError:
        return MASK + trailing
    if "@" not in parts.netloc and not parts.query and not parts.fragment:
        return url
    user = MASK + "@" if "@" in parts.netloc else ""
    host = parts.netloc.rpartition("@")[2]
    query = "?" + MASK if parts.query or parts.fragment else ""
    return f"{parts.scheme}://{user}{host}{parts.path}{query}{trailing}"


def redact(text: object) -> str:
    """``text`` with every secret this layer knows of masked as ``***``."""
    result = str(text)
    for secret in known_secrets():
        if secret in result:
            result = result.replace(secret, MASK)
        quoted = urllib.parse.quote(secret, safe="")
        if quoted != secret and quoted in result:
            result = result.replace(quoted, MASK)
    result = _URL.sub(_mask_url, result)
    result = _CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", result)
    result = _BEARER.sub(lambda m: f"{m.group(1) or m.group(2)} {MASK}", result)
    return _OPENAI_KEY.sub("sk-" + MASK, result)


def redact_known(text: str) -> str:
    """``text`` with the registered secret values masked, and nothing else changed: for
    data (prompts, predictions) whose URLs are content, not credentials."""
    for secret in known_secrets():
        for form in {secret, json.dumps(secret, ensure_ascii=False)[1:-1]}:
            if form in text:
                text = text.replace(form, MASK)
    return text


def first_line(text: object) -> str:
    """The first non-empty line of a message (httpx adds a "For more information" line)."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def redact_obj(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string in it (dicts, lists, tuples)."""
    return _redact_obj(value, {})


def _redact_obj(value: Any, done: dict[str, str]) -> Any:
    # ``done`` redacts each distinct string once: a report's item ids and statuses repeat
    # in every cell, a million strings among a few thousand values.
    if isinstance(value, str):
        redacted = done.get(value)
        if redacted is None:
            redacted = done[value] = redact(value)
        return redacted
    if isinstance(value, dict):
        return {key: _redact_obj(item, done) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_obj(item, done) for item in value]
    return value

