"""The response cache and the request slots, against the fake endpoint."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.cache.responses import CachingChatModel, ResponseStore, once, request_key
from pytest_budgetbench.errors import EndpointError
from pytest_budgetbench.model.chat import ChatModel, Completion, RequestSlots
from tests.fake_openai import FakeOpenAI

QUESTION = [{"role": "user", "content": "Please remember: my dog is called Rex."},
            {"role": "user", "content": "What is my dog called?"}]


def cached_chat(fake: FakeOpenAI, path: Path, run_id: str = "run-a") -> CachingChatModel:
    chat = ChatModel(fake.base_url, fake.model, attempts=1, backoff_s=0.0)
    return CachingChatModel(chat, ResponseStore(path, run_id=run_id))


def test_a_repeated_request_is_served_from_the_store_with_its_original_latency(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.latency_s = 0.2
    chat = cached_chat(fake, tmp_path / "r.sqlite")
    first = chat.complete(QUESTION, max_tokens=8)
    again = chat.complete(QUESTION, max_tokens=8)
    assert len(fake.requests) == 1
    assert (first.cached, again.cached) == (False, True)
    assert again.text == first.text == "Rex"
    assert again.latency_s == pytest.approx(first.latency_s) and again.latency_s >= 0.2


def test_a_new_run_reads_replies_made_by_an_earlier_one(fake: FakeOpenAI, tmp_path: Path) -> None:
    cached_chat(fake, tmp_path / "r.sqlite", "run-a").complete(QUESTION, max_tokens=8)
    reply = cached_chat(fake, tmp_path / "r.sqlite", "run-b").complete(QUESTION, max_tokens=8)
    assert reply.cached and len(fake.requests) == 1


def test_refresh_sends_again_once_then_serves_its_own_reply(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    path = tmp_path / "r.sqlite"
    cached_chat(fake, path, "run-a").complete(QUESTION, max_tokens=8)
    chat = ChatModel(fake.base_url, fake.model, attempts=1, backoff_s=0.0)
    refreshing = CachingChatModel(chat, ResponseStore(path, run_id="run-b", this_run_only=True))
    assert not refreshing.complete(QUESTION, max_tokens=8).cached
    assert refreshing.complete(QUESTION, max_tokens=8).cached
    assert len(fake.requests) == 2


@pytest.mark.parametrize(
    "change",
    [{"max_tokens": 9}, {"messages": [{"role": "user", "content": "What is my cat called?"}]},
     {"model": "other"}, {"params": {"temperature": 0.7, "seed": 0}},
     {"base_url": "http://elsewhere:1/v1"}],
)
def test_the_key_changes_with_anything_that_shapes_the_reply(change: dict) -> None:
    request = {"base_url": "http://h:1/v1", "model": "m", "params": {"temperature": 0.0, "seed": 0},
               "messages": QUESTION, "max_tokens": 8}

    def key(r: dict) -> str:
        params = {**r["params"], "max_tokens": r["max_tokens"]}
        return request_key(r["base_url"], r["model"], params, r["messages"])

    assert key({**request, **change}) != key(request)


def test_the_key_ignores_secrets_in_the_endpoint_url() -> None:
    params = {"temperature": 0.0}
    assert request_key("http://user:sk-1@h:1/v1?key=a", "m", params, QUESTION) == request_key(
        "http://h:1/v1", "m", params, QUESTION
    )


def test_threads_asking_the_same_request_send_it_once(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.latency_s = 0.3
    chat = cached_chat(fake, tmp_path / "r.sqlite")
    replies = []

    def ask() -> None:
        replies.append(chat.complete(QUESTION, max_tokens=8))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fake.requests) == 1
    assert sorted(r.cached for r in replies) == [False, True, True, True]


class _InterleavedStore(ResponseStore):
    """A store that lets another thread of this process act at the edges of its next
    transaction: just before it begins, or just after it commits."""

    before_begin: Any = None
    after_commit: Any = None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        if self.before_begin is not None:
            hook, self.before_begin = self.before_begin, None
            hook()
        with super()._transaction() as db:
            yield db
        if self.after_commit is not None:
            hook, self.after_commit = self.after_commit, None
            hook()


@pytest.mark.parametrize("step", ["claim", "store", "release"])
def test_a_thread_never_takes_over_a_claim_another_thread_is_still_sending(
        tmp_path: Path, step: str) -> None:
    """From a claim's commit until the reply is stored (or the claim released), a second
    thread of the same process that sees the claim waits: it never sends the request too."""
    owner = _InterleavedStore(tmp_path / "r.sqlite", run_id="r")
    other = ResponseStore(tmp_path / "r.sqlite", run_id="r")
    seen: list[bool] = []

    def other_claims() -> None:
        thread = threading.Thread(target=lambda: seen.append(other.claim("k")))
        thread.start()
        thread.join()

    owner.after_commit = other_claims if step == "claim" else None
    assert owner.claim("k")
    owner.before_begin = other_claims
    if step == "store":
        owner.store("k", Completion(text="hi", prompt_tokens=1, completion_tokens=1,
                                    latency_s=0.1))
    elif step == "release":
        owner.release("k")
    assert seen[0] is False


def test_processes_asking_the_same_request_send_it_once(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.latency_s = 0.5
    store = str(tmp_path / "r.sqlite")
    script = (
        "from pathlib import Path\n"
        "from pytest_budgetbench.cache.responses import CachingChatModel, ResponseStore\n"
        "from pytest_budgetbench.model.chat import ChatModel\n"
        f"chat = CachingChatModel(ChatModel({fake.base_url!r}, {fake.model!r}),\n"
        f"    ResponseStore(Path({store!r}), run_id='r'))\n"
        f"print(chat.complete({QUESTION!r}, max_tokens=8).cached)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outputs == ["False", "True", "True"]
    assert len(fake.requests) == 1


def test_a_reply_stored_between_a_miss_and_the_claim_is_served_not_sent_again(
        tmp_path: Path) -> None:
    """Another process may store the reply and let go of its claim after this one's lookup
    missed and before its claim: the claim then succeeds, and the reply must still not be
    asked for again (seen in CI on a loaded machine: two of three processes sent it)."""
    waiter = _InterleavedStore(tmp_path / "r.sqlite", run_id="r")
    sender = ResponseStore(tmp_path / "r.sqlite", run_id="r")
    reply = Completion(text="hi", prompt_tokens=1, completion_tokens=1, latency_s=0.1)

    def sender_sends() -> None:
        def send() -> None:
            assert sender.claim("k")
            sender.store("k", reply)
        thread = threading.Thread(target=send)
        thread.start()
        thread.join()

    made: list[str] = []

    def make() -> Completion:
        made.append("k")
        return reply

    waiter.before_begin = sender_sends  # the claim's transaction is the first after the miss
    served = once(waiter, "k", make)
    assert made == [] and served.cached and served.text == "hi"
    assert waiter._db().execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0


def test_a_claim_left_by_a_killed_process_is_taken_over(fake: FakeOpenAI, tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    key = request_key(fake.base_url, fake.model, {"temperature": 0.0, "seed": 0, "max_tokens": 8},
                      QUESTION)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store = ResponseStore(path, run_id="r")
    store._db().execute("INSERT INTO claims VALUES (?, 'gone', ?, ?, ?)",
                        (key, store._host, dead.pid, time.time()))
    reply = cached_chat(fake, path).complete(QUESTION, max_tokens=8)
    assert reply.text == "Rex" and len(fake.requests) == 1


def test_a_failed_request_is_not_stored_and_its_claim_is_released(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.faults = ["500"]
    chat = cached_chat(fake, tmp_path / "r.sqlite")
    with pytest.raises(EndpointError):
        chat.complete(QUESTION, max_tokens=8)
    reply = chat.complete(QUESTION, max_tokens=8)  # not blocked by a stale claim
    assert not reply.cached and reply.text == "Rex" and len(fake.requests) == 2


def test_a_reply_that_could_not_be_stored_does_not_block_the_next_request_for_it(
    fake: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk fails the store and the release alike: the thread's own claim is left
    behind, and the next request for the key (another budget's cell) must not wait on it."""
    chat = cached_chat(fake, tmp_path / "r.sqlite")
    store = chat._store

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        send = chat._chat.complete

        def send_then_fill_the_disk(*args: Any, **kwargs: Any) -> Any:
            reply = send(*args, **kwargs)
            patched.setattr(store, "_transaction", disk_full)
            return reply

        patched.setattr(chat._chat, "complete", send_then_fill_the_disk)
        with pytest.raises(OSError):
            chat.complete(QUESTION, max_tokens=8)
    answer: list[str] = []
    thread = threading.Thread(target=lambda: answer.append(
        chat.complete(QUESTION, max_tokens=8).text), daemon=True)
    thread.start()
    thread.join(60)  # a guard against the hang, not a timing assertion
    assert answer == ["Rex"] and len(fake.requests) == 2


def test_slots_bound_requests_in_flight_across_threads(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.latency_s = 0.2
    chat = ChatModel(fake.base_url, fake.model, slots=RequestSlots(tmp_path / "slots", 2))
    threads = [threading.Thread(target=chat.complete, args=(QUESTION,), kwargs={"max_tokens": 4})
               for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fake.requests) == 6
    assert fake.max_in_flight == 2


def test_a_killed_holder_frees_its_slot(tmp_path: Path) -> None:
    slots = RequestSlots(tmp_path / "slots", 1)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path\n"
         "from pytest_budgetbench.model.chat import RequestSlots\n"
         f"with RequestSlots(Path({str(tmp_path / 'slots')!r}), 1).hold():\n"
         "    print('held', flush=True); time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    with slots.hold():  # would wait forever if the dead holder kept its slot
        pass


def test_the_embedded_servers_identity_outlives_its_port_and_context_size() -> None:
    from dataclasses import replace

    from pytest_budgetbench.model.endpoint import Endpoint

    first = Endpoint("http://127.0.0.1:41000/v1", "m", embedded=True, gguf_path="/p/S.gguf",
                     server_flags={"n_ctx": 8192, "n_threads": 2})
    later = replace(first, base_url="http://127.0.0.1:42000/v1",
                    server_flags={"n_ctx": 16384, "n_threads": 2})
    other_threads = replace(first, server_flags={"n_ctx": 8192, "n_threads": 4})
    assert first.identity == later.identity != other_threads.identity
    remote = Endpoint("http://127.0.0.1:41000/v1", "m")
    assert remote.identity == remote.base_url != first.identity
