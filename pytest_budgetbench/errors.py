"""The exception tree of pytest-budgetbench.

    BudgetBenchError
    ├── ConfigError            a bad option, ini value or command argument (a pytest UsageError)
    ├── NothingToRun           the sweep is valid but holds no cell (an empty shard): exit 0
    ├── DataError              a missing or malformed dataset file or record
    │   ├── MalformedLine          a line of a JSON-lines or CSV text; the reader names the file
    │   └── MalformedRecord        a record's fields; the task names the file and line
    ├── MissingDependency      an optional extra is not installed
    │   └── UnsupportedPython      or cannot be: its package needs a newer Python
    ├── StrategyError          a strategy raised, or returned something that is not messages
    │   └── StrategyAborted        a strategy raised SystemExit or KeyboardInterrupt: stop
    ├── TokenizerError         the token counter cannot load or cannot count
    │   └── RouteError             a server's counting route answered with an error status
    ├── RecordError            a row could not be written whole (disk full, short write)
    ├── RunStopping            the session is stopping (Ctrl-C): the cell in flight records nothing
    ├── CacheError             a cache file (replies, counts, vectors) cannot be used
    ├── ReportError            the records cannot make a report (no run directory, no cell row)
    │   ├── DiffError              two runs cannot be compared (no common cell, other items)
    │   └── BaselineError          a baseline report.json cannot be read or has another schema
    └── EndpointError          the model endpoint failed: never an answer to grade
        ├── RequestTimeout         a request did not end within its deadline (retried first)
        ├── RequestRejected        the endpoint refused the request as invalid (400, 422)
        ├── EndpointUnavailable    the server failed every attempt: another replica may answer
        ├── MalformedReply         the server answered, but with a reply the runner cannot use
        ├── PromptCut              the server counted fewer prompt tokens than were sent: it cut
        └── EmbeddedServerError    the embedded llama.cpp server did not start

BudgetExceeded is not an error of the harness: it is the budget assertion, and so
subclasses AssertionError, which pytest reports as a test failure.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterable, Sequence
from typing import NamedTuple


class BudgetBenchError(Exception):
    """Base class of every error raised by pytest-budgetbench."""


class ConfigError(BudgetBenchError):
    """A command-line option, ini value or argument is invalid."""


class NothingToRun(BudgetBenchError):
    """The sweep is valid but holds no cell (an empty shard): not an error, one line."""


class DataError(BudgetBenchError):
    """A dataset file or record is missing or malformed."""


class MalformedLine(DataError):
    """Line ``line`` of a JSON-lines or CSV text is malformed (``problem`` says how); the
    reader that knows the file names it."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line, self.problem = line, problem


class MalformedRecord(DataError):
    """One record of a dataset has a missing or malformed field; the task that reads it
    adds the file and line."""


class MissingDependency(BudgetBenchError):
    """An optional dependency is not installed."""

    def __init__(self, module: str, extra: str, purpose: str, hint: str = "",
                 also: Sequence[tuple[str, str, str]] = ()) -> None:
        """``also``: more (module, extra, purpose) that are missing, named in the same line
        and installed by the same command."""
        missing = [(module, extra, purpose), *also]
        needs = "; ".join(f"{what} needs the '{name}' package" for name, _, what in missing)
        extras = ",".join(dict.fromkeys(name for _, name, _ in missing))
        super().__init__(
            f"{needs}: pip install 'pytest-budgetbench[{extras}]'" + (f", {hint}" if hint else "")
        )
        self.module = module
        self.extra = extra


class UnsupportedPython(MissingDependency):
    """An optional package that needs a newer Python than this one: its extra's marker
    installs nothing here (the OpenHands SDK needs 3.12), so the line names the Python."""

    def __init__(self, requirement: Requirement, purpose: str) -> None:
        assert requirement.python is not None
        needed = ".".join(map(str, requirement.python))
        BudgetBenchError.__init__(
            self, f"{purpose} needs Python {needed} or newer (this is "
            f"{platform.python_version()}): run it from a Python {needed} environment with "
            f"pip install 'pytest-budgetbench[{requirement.extra}]'")
        self.module = requirement.package or requirement.module
        self.extra = requirement.extra


class StrategyError(BudgetBenchError):
    """A strategy raised, or returned something that is not a list of chat messages."""


class StrategyAborted(StrategyError):
    """A strategy raised SystemExit or KeyboardInterrupt: its cell is recorded as an error
    and the run stops cleanly (the plugin turns this into ``pytest.exit``)."""


class RunStopping(BudgetBenchError):
    """The session is stopping (Ctrl-C, SIGTERM) while a cell runs in a thread: the cell
    ends before its next model call and records no row, so a resume runs it again."""


class TokenizerError(BudgetBenchError):
    """The token counter could not be loaded or could not count a prompt."""


class RouteError(TokenizerError):
    """A server's counting route answered with an error status: its status and what its
    body said (the server counter reads it, and says what it means for that server)."""

    def __init__(self, route: str, status: int, said: str) -> None:
        super().__init__(f"{route}: HTTP {status}{': ' + said if said else ''}")
        self.route, self.status, self.said = route, status, said


class RecordError(BudgetBenchError):
    """A record could not be written whole: the file was cut back to its last full line."""


class CacheError(BudgetBenchError):
    """A cache file cannot be opened, read or written (not a database, damaged, foreign);
    the message names the file and how to reset it."""


class ReportError(BudgetBenchError):
    """The records cannot make a report (a missing run directory, for one)."""


class DiffError(ReportError):
    """The two runs cannot be compared (no cell in common, or not the same items)."""


class BaselineError(ReportError):
    """A baseline report.json that cannot be read or has another schema."""


class EndpointError(BudgetBenchError):
    """The model endpoint failed (unreachable, timed out, or answered malformed data)."""


class RequestTimeout(EndpointError):
    """A request that did not end within its deadline (the whole request, reply included);
    the model client retries it, and the last one becomes an EndpointError that says so."""


class RequestRejected(EndpointError):
    """The endpoint answered 400 or 422: it does not take the request as sent (a
    ``response_format`` it does not know, say). Never retried."""


class EndpointUnavailable(EndpointError):
    """Every attempt at a request failed for a reason of the server's, not the request's:
    refused or dropped connections, timeouts, 429s, 5xx, or a Retry-After too long to wait.
    A pool of replicas takes such a replica out and sends the request to another
    (:mod:`~pytest_budgetbench.model.replicas`); a 400 is the request's, the same at every
    replica, and stays a plain EndpointError (a malformed reply: :class:`MalformedReply`)."""


class MalformedReply(EndpointError):
    """The endpoint answered (HTTP 200), but the reply cannot be used: a body that is not
    JSON, no choices, no content, tool calls that share an id. Never retried at the same
    server. A pool of replicas sends the request to another: where that one's reply is
    usable, the first replica is at fault and is taken out as for a 5xx; where every reply
    is malformed, the model's reply is, and this is raised."""


class PromptCut(EndpointError):
    """The server counted fewer prompt tokens than the sweep sent, by more than its counter
    allows (:func:`~pytest_budgetbench.engine.calls.cut_by_server`): it cut the prompt (a
    context too small, a proxy that drops messages), so its reply answers a prompt no
    strategy built. The cell is an error, never graded, and the reply is not cached."""

    def __init__(self, message: str, server_tokens: int | None = None) -> None:
        super().__init__(message)
        self.server_tokens = server_tokens


class EmbeddedServerError(EndpointError):
    """The embedded llama.cpp server could not be started."""


class BudgetExceeded(AssertionError):
    """A prompt exceeded its token budget; the prompt was not sent."""


def require(module: str, extra: str, purpose: str) -> object:
    """Import an optional dependency, or raise one clear MissingDependency."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(module, extra, purpose) from exc


class Requirement(NamedTuple):
    """An optional package that a strategy, task or feature imports: its top-level import
    name, the extra that installs it, and its pip name where that differs.

    ``install`` is the command that installs the package when its extra cannot (a package
    whose declared dependencies would break this project's stack, installed with
    ``--no-deps`` after the extra that brings the few it needs); the line that reports it
    missing names the extra, then this command."""

    module: str
    extra: str
    package: str = ""
    install: str = ""
    python: tuple[int, int] | None = None
    """The oldest Python the package installs on, e.g. ``(3, 12)``, where its extra has a
    Python marker: on an older one the requirement is unmet whatever is installed."""

    def python_unmet(self) -> bool:
        """Whether this Python is older than the package needs."""
        return self.python is not None and sys.version_info[:2] < self.python

    @staticmethod
    def hint(found: Iterable[Requirement]) -> str:
        """What to run after the extras, for these missing requirements: "" when their
        extras install them."""
        installs = dict.fromkeys(r.install for r in found if r.install)
        return "then " + ", then ".join(installs) if installs else ""


def first_missing(requirements: Iterable[Requirement]) -> Requirement | None:
    """The first requirement that is not installed (or needs a newer Python), or None.
    Imports nothing but the parents of a dotted name (``llama_index`` of
    ``llama_index.core``; a top-level name's spec is found on the path), so it costs
    milliseconds."""
    import importlib.util

    for requirement in requirements:
        if requirement.python_unmet():
            return requirement
        try:
            found = importlib.util.find_spec(requirement.module)
        except ModuleNotFoundError:  # a dotted name whose parent is not installed
            found = None
        if found is None:
            return requirement
    return None


def check_installed(requirements: Iterable[Requirement], purpose: str, hint: str = "") -> None:
    """Raise MissingDependency naming the first requirement that is not installed."""
    missing = first_missing(requirements)
    if missing is not None and missing.python_unmet():
        raise UnsupportedPython(missing, purpose)
    if missing is not None:
        hint = ", ".join(filter(None, [Requirement.hint([missing]), hint]))
        raise MissingDependency(missing.package or missing.module, missing.extra, purpose, hint)
