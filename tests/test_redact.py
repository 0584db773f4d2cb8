"""The redaction layer, and the places where text leaves the process: model errors,
query-string endpoints, the token server's errors."""

from __future__ import annotations

import base64
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_budgetbench.errors import EndpointError, TokenizerError
from pytest_budgetbench.model.chat import ChatModel, probe_endpoint
from pytest_budgetbench.model.endpoint import Endpoint
from pytest_budgetbench.redact import (
    MASK,
    Secret,
    forget_secrets,
    redact,
    redact_url,
    register_secret,
    register_url,
    split_query,
)
from pytest_budgetbench.tokens.server import ServerCounter
from tests.fake_openai import FakeOpenAI

KEY = "sk-plantedKEYabcdef123456"
PASSWORD = "pw-planted-0042"
QUERY_SECRET = "qs-planted-7788"
QUESTION = [{"role": "user", "content": "my dog is called Rex"},
            {"role": "user", "content": "What is my dog called?"}]


@pytest.fixture(autouse=True)
def _fresh_secrets() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


def _url(fake: FakeOpenAI) -> str:
    host = fake.base_url.split("://", 1)[1]
    return f"http://bob:{PASSWORD}@{host}?key={QUERY_SECRET}"


def _assert_clean(text: str) -> None:
    basic = base64.b64encode(f"bob:{PASSWORD}".encode()).decode()
    for secret in (KEY, PASSWORD, QUERY_SECRET, basic):
        assert secret not in text, text


# -- the layer --------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    f"Client error '401' for url 'http://bob:{PASSWORD}@h:1/v1/models?key={QUERY_SECRET}'",
    f'{{"error": "invalid credentials: Bearer {KEY}"}}',
    f'{{\\"authorization\\": \\"Bearer {KEY}\\"}}',
    f"api-key: {KEY}",
    f"x-api-key={KEY}&next=1",
    f"make_counter(choice='auto', api_key='{KEY}')",
    f"echoed {QUERY_SECRET} and {PASSWORD}",
    f"invalid credentials: Basic {base64.b64encode(f'bob:{PASSWORD}'.encode()).decode()}",
])
def test_redact_masks_keys_url_credentials_and_echoed_headers(text: str) -> None:
    register_secret(KEY)
    register_url(f"http://bob:{PASSWORD}@h/v1?key={QUERY_SECRET}")
    cleaned = redact(text)
    _assert_clean(cleaned)
    assert MASK in cleaned


def test_redact_keeps_text_without_secrets() -> None:
    text = ("cell memory-0001-rag-2048 sent 2311 tokens; see http://example.com/docs. "
            "A basic strategy, basically.")
    assert redact(text) == text


def test_a_secret_reprs_as_stars_but_works_as_its_value() -> None:
    secret = Secret(KEY)
    assert repr(secret) == repr(MASK) and KEY not in repr([secret, {"k": secret}])
    assert secret == KEY and f"Bearer {secret}" == f"Bearer {KEY}"


def test_an_endpoint_repr_hides_its_url() -> None:
    endpoint = Endpoint(base_url=f"http://bob:{PASSWORD}@h/v1", model="m")
    assert PASSWORD not in repr(endpoint) and "model='m'" in repr(endpoint)


def test_split_query_keeps_the_path_and_the_parameters() -> None:
    assert split_query("https://h/v1?key=K&x=") == ("https://h/v1", {"key": "K", "x": ""})
    assert split_query("https://h/v1") == ("https://h/v1", {})


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://user:password@host.example:8080/v1?api_key=sk-1",
         "http://host.example:8080/v1"),
        ("https://sk-secret-123@api.example.com/v1", "https://api.example.com/v1"),
        ("https://api.example.com/v1?key=sk-secret-123&x=1#frag", "https://api.example.com/v1"),
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
        ("http://localhost/v1/", "http://localhost/v1/"),
    ],
)
def test_redact_url_drops_credentials_and_queries(url: str, expected: str) -> None:
    redacted = redact_url(url)
    assert redacted == expected
    assert "password" not in redacted
    assert "sk-" not in redacted


def test_redact_url_keeps_ipv6_brackets() -> None:
    assert redact_url("http://user:pw@[::1]:8080/v1?k=s") == "http://[::1]:8080/v1"


# -- query strings and echoed credentials ------------------------------------------------
def test_an_endpoint_query_string_goes_with_each_request_not_into_its_path(
    fake: FakeOpenAI,
) -> None:
    url = f"{fake.base_url}?key={QUERY_SECRET}"
    assert probe_endpoint(url, KEY) == [fake.model]
    chat = ChatModel(url, fake.model, api_key=KEY)
    assert chat.complete(QUESTION, max_tokens=4).text == "Rex"
    assert fake.queries == [f"key={QUERY_SECRET}"] * 2  # /models, then /chat/completions


def test_a_401_that_echoes_the_key_is_redacted(fake: FakeOpenAI) -> None:
    register_secret(KEY)
    fake.faults = ["401echo"]
    with pytest.raises(EndpointError) as info:
        ChatModel(_url(fake), fake.model, api_key=KEY).complete(QUESTION, max_tokens=4)
    message = str(info.value)
    _assert_clean(message)
    assert "AuthenticationError" in message and "\n" not in message


def test_a_404_from_the_probe_is_one_redacted_line(tmp_path: Path) -> None:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        url = f"http://bob:{PASSWORD}@127.0.0.1:{port}/v1?key={QUERY_SECRET}"
        with pytest.raises(EndpointError) as info:
            probe_endpoint(url, KEY)
    finally:
        server.shutdown()
        server.server_close()
    message = str(info.value)
    _assert_clean(message)
    assert "\n" not in message and "HTTP 404" in message and f"127.0.0.1:{port}" in message
    assert "For more information" not in message


def test_the_token_server_error_names_no_credentials(fake: FakeOpenAI) -> None:
    counter = ServerCounter(_url(fake), fake.model, KEY)  # the fake has no /tokenize
    with pytest.raises(TokenizerError) as info:
        counter.count_text("probe")
    message = str(info.value)
    _assert_clean(message)
    assert "\n" not in message and "/tokenize" in message


def test_short_url_credentials_do_not_mask_ordinary_words() -> None:
    # A user name "user" must not turn every chat role into "***"; the URL itself still
    # loses its user info.
    register_url("http://user:pw@example.test/v1")
    try:
        assert redact('{"role": "user", "content": "pw"}') == '{"role": "user", "content": "pw"}'
        assert "user:pw" not in redact("calling http://user:pw@example.test/v1/models")
    finally:
        forget_secrets()
