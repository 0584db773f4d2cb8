"""Name -> class lookup shared by strategies and tasks.

A name resolves, in order, to a built-in, to an entry point of the registry's group, or,
when it contains a colon, to ``module:attr`` imported directly. A registry may also take
*patterns*: a name ``<prefix><suffix>`` (e.g. ``budgetmem@0.1``) resolves to what the
factory ``module:attr`` registered for the prefix returns for the suffix.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar, cast

from pytest_budgetbench.errors import ConfigError

T = TypeVar("T")



def import_object(target: str) -> object:
    """The object ``module:attr`` (or ``module:attr.sub``) names; ImportError or
    AttributeError when it does not exist."""
    module_name, _, attr = target.partition(":")
    found: object = importlib.import_module(module_name)
    for part in attr.split("."):
        found = getattr(found, part)
    return found

class Registry(Generic[T]):
    def __init__(
        self,
        kind: str,
        option: str,
        group: str,
        base: type[Any],
        builtin: dict[str, str],
        patterns: dict[str, str] | None = None,
        adapt: Callable[[str, object], type[Any] | None] | None = None,
        accepts: str = "",
    ) -> None:
        # ``base`` is an abstract class, which mypy will not accept as ``type[T]``.
        self.kind = kind
        self.option = option
        self.group = group
        self.base = base
        self.builtin = builtin
        self.patterns = patterns or {}
        self.adapt = adapt
        """Makes a class of what is not a ``base`` subclass (e.g. a plain callable
        strategy), or returns None."""
        self.accepts = accepts
        """What else ``adapt`` takes, for the error message."""

    def available(self) -> dict[str, str]:
        """Every selectable name, mapped to its ``module:attr``."""
        names = dict(self.builtin)
        for ep in entry_points(group=self.group):
            names.setdefault(ep.name, ep.value)
        return names

    def classes(self, named: Iterable[str] = (), *, registered: bool = True) -> list[type[T]]:
        """The classes of every built-in and entry point (unless not ``registered``), then
        of the ``module:attr`` names among ``named``, each once. One that fails to import
        is left out: a broken third-party class must not break a pytest run that does not
        select it (selecting it reports the error)."""
        listed = list(self.available().values()) if registered else []
        targets = [*listed, *(name for name in named if ":" in name)]
        found: list[type[T]] = []
        for target in targets:
            try:
                cls = self._check(target, self._import(target))
            except ConfigError:
                continue
            if cls not in found:
                found.append(cls)
        return found

    def resolve(self, spec: str) -> type[T]:
        # A built-in wins over an entry point of its name, so it needs no scan of the
        # installed distributions' entry points (tens of ms of CPU, for every thread that
        # loads its strategy under --budgetbench-concurrency).
        target = spec if ":" in spec else self.builtin.get(spec)
        if target is not None:
            return self._check(spec, self._import(target))
        known = self.available()
        target = known.get(spec)
        if target is None:
            pattern = self._pattern(spec)
            if pattern is not None:
                return self._check(spec, pattern)
            listed = [*sorted(known), *(f"{prefix}<...>" for prefix in sorted(self.patterns))]
            raise ConfigError(
                f"unknown {self.kind} '{spec}' in {self.option}; "
                f"known: {', '.join(listed)}, or give module:attr"
            )
        return self._check(spec, self._import(target))

    def _import(self, target: str) -> object:
        try:
            return import_object(target)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot import {self.kind} '{target}': {exc}") from exc

    def _pattern(self, spec: str) -> object | None:
        """What a pattern's factory makes of ``spec``, or None when no prefix matches."""
        for prefix, factory in self.patterns.items():
            if spec.startswith(prefix) and len(spec) > len(prefix):
                make = self._import(factory)
                assert callable(make)
                return make(spec[len(prefix):])
        return None

    def _check(self, spec: str, obj: object) -> type[T]:
        if not (isinstance(obj, type) and issubclass(obj, self.base)):
            adapted = self.adapt(spec, obj) if self.adapt is not None else None
            if adapted is not None:
                return cast(type[T], adapted)
            also = f" or {self.accepts}" if self.accepts else ""
            raise ConfigError(
                f"{self.kind} '{spec}' must be a {self.base.__name__} subclass{also} "
                f"(got {obj!r:.80} that is a {type(obj).__name__})"
            )
        return cast(type[T], obj)
