"""A deadline on a whole HTTP request, reply included.

An HTTP client's timeout bounds each operation (connect, one read, one write), not the
request: a server that sends one byte a second never trips a read timeout, and a reply
that never ends holds its caller for good. :class:`DeadlineClients` bounds the request.

Each request runs in a helper thread, on a client no other request is using (clients are
leased from an idle pool and given back). When the deadline passes first, the caller gets
:class:`RequestTimeout` at once, and the client is closed and dropped: closing it ends the
abandoned request at its next byte, or at its read timeout, so no helper thread outlives
a never-ending reply for long. It works with any client that has a ``close()`` (openai's,
httpx's), whatever HTTP stack sits below.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from pytest_budgetbench.errors import RequestTimeout

C = TypeVar("C")
T = TypeVar("T")


class DeadlineClients(Generic[C]):
    """Clients made by ``make``, each running one request at a time under a deadline.

    Example::

        clients = DeadlineClients(lambda: httpx.Client(timeout=5.0), close=httpx.Client.close)
        response = clients.call(lambda client: client.get(url), timeout=5.0)
    """

    def __init__(self, make: Callable[[], C], close: Callable[[C], object]) -> None:
        self._make = make
        self._close = close
        self._idle: list[C] = []
        self._lock = threading.Lock()

    def call(self, request: Callable[[C], T], timeout: float) -> T:
        """``request(client)``'s result, or its exception; RequestTimeout when it has not
        ended after ``timeout`` seconds (the request is then abandoned, its client closed)."""
        client = self._lease()
        outcome: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                outcome.set_result(request(client))
            except BaseException as exc:  # handed to the caller's thread below
                outcome.set_exception(exc)

        threading.Thread(target=run, name="budgetbench-request", daemon=True).start()
        try:
            concurrent.futures.wait([outcome], timeout=timeout)
        except BaseException:  # an interrupt while waiting: the request is abandoned
            self._discard(client)
            raise
        if not outcome.done():
            self._discard(client)
            raise RequestTimeout(f"no complete reply within {timeout:g} s")
        self.give_back(client)
        return outcome.result()

    def give_back(self, client: C) -> None:
        """Put an idle ``client`` (one that runs no request) in the pool."""
        with self._lock:
            self._idle.append(client)

    def close(self) -> None:
        """Close the idle clients (those running an abandoned request are closed already)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for client in idle:
            self._discard(client)

    def _lease(self) -> C:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._make()

    def _discard(self, client: C) -> None:
        with contextlib.suppress(Exception):  # a client half-way through a request
            self._close(client)
