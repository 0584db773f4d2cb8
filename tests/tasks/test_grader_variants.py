"""Grader variants: ``--budgetbench-grader=TASK:VARIANT`` reaches the task and its grader id."""

from __future__ import annotations

import pytest

from pytest_budgetbench.engine.catalog import make_task
from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.settings.config import Settings, parse_grader_variants
from pytest_budgetbench.tasks import REGISTRY


def test_option_parses_task_variant_pairs() -> None:
    assert parse_grader_variants("locomo:first-line, hotpotqa:first-line") == {
        "locomo": "first-line", "hotpotqa": "first-line"}
    for bad in ("locomo", "locomo:", ":first-line", "locomo:first-line,,"):
        with pytest.raises(ConfigError, match="TASK:VARIANT"):
            parse_grader_variants(bad)


def test_settings_reach_the_task_and_its_grader_id() -> None:
    task = make_task("longbench_v2", Settings(grader={"longbench_v2": "word-guard"}))
    assert task.grader_variant == "word-guard"
    assert task.grader_id == "longbench-v2-official-extract/2+word-guard"
    plain = make_task("longbench_v2", Settings(grader={"locomo": "first-line"}))
    assert plain.grader_variant is None and plain.grader_id == plain.grader_version


def test_variants_are_declared_with_a_description_and_unknown_ones_rejected() -> None:
    for name in ("locomo", "hotpotqa", "longbench_v2", "tau2_retail"):
        cls = REGISTRY.resolve(name)
        assert cls.grader_variants, name
        assert all(isinstance(text, str) and text for text in cls.grader_variants.values())
    with pytest.raises(ConfigError, match=r"needle.*known: none"):
        make_task("needle", Settings(grader={"needle": "first-line"}))
