"""A plain callable as a strategy: ``(messages, budget) -> messages``.

A function, an object with ``__call__`` (and optionally ``reset()``), or a class whose
instances are such objects, named by ``module:attr`` or an entry point, is wrapped in a
:class:`PlainStrategy` subclass with the declared defaults: regimes local-only and
reset-per-item, not a reference, no options, no tool calls. The callable may set ``name``,
``regimes`` (``Regime`` values or their text), ``reference`` and ``handles_tools`` as
attributes to say otherwise; its name is otherwise the attribute it was imported as
(``mymod:keep_last`` -> ``keep_last``).

Each wrapper instance calls a class's fresh instance; a function or an object is shared by
every wrapper (every thread under --budgetbench-concurrency), so keep per-item state in a
class.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies.base import Regime, Strategy, StrategyContext


class PlainStrategy(Strategy):
    """Calls ``target`` (a callable, or a class made once per instance)."""

    target: Any = None
    make: bool = False
    """True when ``target`` is a class: each instance of the wrapper makes its own."""

    def __init__(self) -> None:
        self.call: Any = type(self).target() if type(self).make else type(self).target

    def reset(self, context: StrategyContext) -> None:
        super().reset(context)
        reset = getattr(self.call, "reset", None)
        if callable(reset):
            reset()

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        result = self.call(messages, budget)
        # A tuple is a fine answer; anything else is left for the runner's check to name.
        return list(result) if isinstance(result, tuple) else result


def is_plain_strategy(obj: object) -> bool:
    """Whether ``obj`` is a callable that takes (messages, budget), or a class (not a
    Strategy) whose instances are."""
    if isinstance(obj, type):
        if issubclass(obj, Strategy) or "__call__" not in dir(obj):
            return False
        return _takes_two(obj.__call__, bound=False)
    return callable(obj) and _takes_two(obj, bound=True)


def _takes_two(function: Any, *, bound: bool) -> bool:
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return False
    if not bound:
        parameters = parameters[1:]  # self
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return True
    required = [p for p in positional if p.default is p.empty]
    return len(required) <= 2 <= len(positional)


def plain_strategy_class(spec: str, obj: object) -> type[Strategy] | None:
    """The Strategy class wrapping ``obj``, or None when it is not a plain strategy."""
    if not is_plain_strategy(obj):
        return None
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        name = spec.rpartition(":")[2].rpartition(".")[2] if ":" in spec else spec
    regimes = getattr(obj, "regimes", None)
    attrs: dict[str, Any] = {
        "name": name,
        "target": staticmethod(obj) if inspect.isfunction(obj) else obj,
        "make": isinstance(obj, type),
        "reference": bool(getattr(obj, "reference", False)),
        "handles_tools": bool(getattr(obj, "handles_tools", False)),
        "__doc__": f"The plain strategy {spec}, wrapped.",
    }
    if regimes is not None:
        attrs["regimes"] = frozenset(Regime(r) for r in regimes)
    return type(f"PlainStrategy[{name}]", (PlainStrategy,), attrs)


def wrap_instance(obj: object, name: str = "") -> Strategy:
    """A plain callable already made (e.g. by a test's factory) as a Strategy instance."""
    cls = plain_strategy_class(name or type(obj).__name__, obj)
    if cls is None:
        raise TypeError(f"{obj!r:.60} is neither a Strategy nor a callable (messages, budget) "
                        "-> messages")
    return cls()
