"""The OpenHands policies on a Python the SDK does not install on (3.11): one line naming
the Python it needs, before any cell. (On 3.12 the sweep test skips; the refusal's logic
is tested with a Python no one has.)"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from pytest_budgetbench.errors import (
    MissingDependency,
    Requirement,
    UnsupportedPython,
    check_installed,
    first_missing,
)
from pytest_budgetbench.strategies.frameworks.openhands import (
    OpenHandsLLMSummarizing,
    OpenHandsLLMSummarizingExact,
    OpenHandsNoOp,
)
from tests.fake_openai import FakeOpenAI
from tests.sweeps import sweep_args

FUTURE = Requirement("json", "future", python=(99, 0))  # installed, on a Python too old


def test_a_package_for_a_newer_python_is_missing_whatever_is_installed() -> None:
    assert first_missing([Requirement("json", "core"), FUTURE]) is FUTURE
    assert first_missing([Requirement("json", "core", python=(3, 11))]) is None
    with pytest.raises(UnsupportedPython) as raised:
        check_installed([FUTURE], "the future strategy")
    assert str(raised.value) == (
        f"the future strategy needs Python 99.0 or newer (this is "
        f"{platform.python_version()}): run it from a Python 99.0 environment with "
        "pip install 'pytest-budgetbench[future]'")
    assert isinstance(raised.value, MissingDependency) and raised.value.extra == "future"


def test_every_openhands_policy_requires_python_312() -> None:
    for cls in (OpenHandsNoOp, OpenHandsLLMSummarizing, OpenHandsLLMSummarizingExact):
        assert cls.requires == (Requirement("openhands", "openhands", "openhands-sdk",
                                            python=(3, 12)),)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the SDK installs on this Python")
def test_a_sweep_on_311_stops_before_any_cell_naming_the_python(
    pytester: pytest.Pytester, fake: FakeOpenAI, tmp_path: Path,
) -> None:
    result = pytester.runpytest(*sweep_args(
        fake, tmp_path, "--budgetbench-strategies=truncation,openhands_llm_summarizing",
        "--budgets=512", "--budgetbench-items=2"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    (line,) = [text for text in result.stderr.lines if text.startswith("ERROR:")]
    assert line == (
        "ERROR: strategy 'openhands_llm_summarizing' needs Python 3.12 or newer (this is "
        f"{platform.python_version()}): run it from a Python 3.12 environment with "
        "pip install 'pytest-budgetbench[openhands]'")
    assert fake.requests == [] and not (tmp_path / "out").exists()
