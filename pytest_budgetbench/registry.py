"""Name -> class lookup shared by strategies and tasks.

A name resolves, in order, to a built-in, to an entry point of the registry's group, or,
when it contains a colon, to ``module:attr`` imported directly.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar, cast

from pytest_budgetbench.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(
        self, kind: str, option: str, group: str, base: type[Any], builtin: dict[str, str]
    ) -> None:
        # ``base`` is an abstract class, which mypy will not accept as ``type[T]``.
        self.kind = kind
        self.option = option
        self.group = group
        self.base = base
        self.builtin = builtin

    def available(self) -> dict[str, str]:
        """Every selectable name, mapped to its ``module:attr``."""
        names = dict(self.builtin)
        for ep in entry_points(group=self.group):
            names.setdefault(ep.name, ep.value)
        return names

    def resolve(self, spec: str) -> type[T]:
        known = self.available()
        target = spec if ":" in spec else known.get(spec)
        if target is None:
            raise ConfigError(
                f"unknown {self.kind} '{spec}' in {self.option}; "
                f"known: {', '.join(sorted(known))}, or give module:attr"
            )
        module_name, _, attr = target.partition(":")
        try:
            obj: object = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot import {self.kind} '{target}': {exc}") from exc
        if not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise ConfigError(
                f"{self.kind} '{spec}' must be a {self.base.__name__} subclass "
                f"(got {obj!r} that is a {type(obj).__name__})"
            )
        return cast(type[T], obj)
