"""Argparse types for the ``budgetbench`` console commands.

An option that the plugin also has (``--seed``, ``--resamples``, ``--max-tokens``, ...)
takes its parser and default from :data:`pytest_budgetbench.settings.config.OPTIONS`, looked up by
``dest``, so the command line and the plugin accept the same values; only options of the
commands alone (``--episodes``, ``--lr``) take a parser of :mod:`pytest_budgetbench.options`
through :func:`argument_type`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.options import Option, Parser
from pytest_budgetbench.settings.config import OPTIONS


def argument_type(parser: Parser) -> Callable[[str], Any]:
    """One of :mod:`pytest_budgetbench.options`' parsers as an argparse type, for an option
    of the commands alone (``--episodes``, ``--lr``): its ``ValueError("must be ...")``
    becomes argparse's error, with the value, as :meth:`Option.read` words it."""
    def parse(text: str) -> Any:
        try:
            return parser(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (got {text!r})") from None

    parse.__name__ = getattr(parser, "__name__", "value")  # argparse names the type
    return parse


def option_spec(dest: str) -> Option:
    """The plugin's declaration of option ``dest``."""
    for spec in OPTIONS:
        if spec.dest == dest:
            return spec
    raise KeyError(f"config.OPTIONS declares no option {dest!r}")


def option_type(dest: str) -> Callable[[str], Any]:
    """The plugin's parser of ``dest`` as an argparse type: its ConfigError, which names
    the plugin's flag, becomes argparse's error for the command's own flag."""
    spec = option_spec(dest)

    def parse(text: str) -> Any:
        try:
            return spec.read(text, spec.flags[0])
        except ConfigError as exc:
            message = str(exc)
            for flag in spec.flags:  # "--budgetbench-seed must be ..." -> "must be ..."
                message = message.removeprefix(flag).lstrip()
            raise argparse.ArgumentTypeError(message) from None

    parse.__name__ = spec.dest  # argparse names the type in some of its messages
    return parse


def from_option(dest: str, **overrides: Any) -> dict[str, Any]:
    """``add_argument`` keywords for an option the plugin declares: its parser, default
    and metavar; ``overrides`` (a help text, say) win."""
    spec = option_spec(dest)
    keywords: dict[str, Any] = {"type": option_type(dest), "default": spec.default}
    if spec.metavar:
        keywords["metavar"] = spec.metavar
    return {**keywords, **overrides}
