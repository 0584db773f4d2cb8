"""The exception tree of pytest-budgetbench.

    BudgetBenchError
    ├── ConfigError            a bad option or ini value (shown as a pytest UsageError)
    ├── DataError              a missing or malformed dataset file or record
    ├── MissingDependency      an optional extra is not installed
    ├── StrategyError          a strategy raised, or returned something that is not messages
    │   └── StrategyAborted        a strategy raised SystemExit or KeyboardInterrupt: stop
    ├── TokenizerError         the token counter cannot load or cannot count
    ├── RecordError            a row could not be written whole (disk full, short write)
    ├── CacheError             a cache file (replies, counts, vectors) cannot be used
    └── EndpointError          the model endpoint failed: never an answer to grade
        └── EmbeddedServerError    the embedded llama.cpp server did not start

BudgetExceeded is not an error of the harness: it is the budget assertion, and so
subclasses AssertionError, which pytest reports as a test failure.
"""

from __future__ import annotations


class BudgetBenchError(Exception):
    """Base class of every error raised by pytest-budgetbench."""


class ConfigError(BudgetBenchError):
    """A command-line option or ini value is invalid."""


class DataError(BudgetBenchError):
    """A dataset file or record is missing or malformed."""


class MissingDependency(BudgetBenchError):
    """An optional dependency is not installed."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the '{module}' package: "
            f"pip install 'pytest-budgetbench[{extra}]'"
        )
        self.module = module
        self.extra = extra


class StrategyError(BudgetBenchError):
    """A strategy raised, or returned something that is not a list of chat messages."""


class StrategyAborted(StrategyError):
    """A strategy raised SystemExit or KeyboardInterrupt: its cell is recorded as an error
    and the run stops cleanly (the plugin turns this into ``pytest.exit``)."""


class TokenizerError(BudgetBenchError):
    """The token counter could not be loaded or could not count a prompt."""


class RecordError(BudgetBenchError):
    """A record could not be written whole: the file was cut back to its last full line."""


class CacheError(BudgetBenchError):
    """A cache file cannot be opened, read or written (not a database, damaged, foreign);
    the message names the file and how to reset it."""


class EndpointError(BudgetBenchError):
    """The model endpoint failed (unreachable, timed out, or answered malformed data)."""


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
