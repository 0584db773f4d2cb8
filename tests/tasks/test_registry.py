"""Every real-benchmark task is selectable by name, and no grader credits a non-answer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_budgetbench.engine.declared import flag_specs
from pytest_budgetbench.messages import check_messages
from pytest_budgetbench.tasks import REGISTRY, Item, Task, TaskOptions
from pytest_budgetbench.tasks import _fixtures as fx

NAMES = ("longbench_v2", "longmemeval", "locomo", "hotpotqa", "swe_verified", "needle",
         "tau2_retail", "image_probe")

WRITERS: dict[str, Callable[[Path], Path | None]] = {
    "longbench_v2": lambda d: fx.write_json(d / "data.json", fx.longbench_v2_records()),
    "longmemeval": lambda d: fx.write_json(d / "longmemeval_s.json", fx.longmemeval_records()),
    "locomo": lambda d: fx.write_json(d / "locomo10.json", fx.locomo_samples()),
    "hotpotqa": lambda d: fx.write_json(d / "hotpot.json", fx.hotpotqa_records()),
    "swe_verified": lambda d: fx.write_jsonl(d / "swe.jsonl", fx.swe_verified_records()),
    "needle": lambda d: None,
    "tau2_retail": lambda d: fx.tau2_retail_domain(d / "retail"),
    "image_probe": lambda d: None,
}


@pytest.mark.parametrize("name", NAMES)
def test_selectable_by_name(name: str) -> None:
    cls = REGISTRY.resolve(name)
    assert issubclass(cls, Task)
    assert cls.name == name
    assert cls.grader_version and "/" in cls.grader_version
    # One source of truth: the task's data declaration makes its flag, or no flag exists.
    assert (cls.data is not None) == (name != "image_probe")
    assert (cls.data is not None and cls.data.required) == (name not in ("needle", "image_probe"))
    flags = {flag for spec in flag_specs() for flag in spec.flags}
    assert (f"--budgetbench-data-{name}" in flags) == (cls.data is not None)


def _load(name: str, tmp_path: Path) -> tuple[Task, list[Item]]:
    task = REGISTRY.resolve(name)(TaskOptions(data_path=WRITERS[name](tmp_path),
                                              chunk_tokens=32, items=6))
    return task, task.load()


@pytest.mark.parametrize("name", NAMES)
def test_items_are_well_formed(name: str, tmp_path: Path) -> None:
    _task, items = _load(name, tmp_path)
    assert items
    assert len({i.item_id for i in items}) == len(items)
    for item in items:
        check_messages(list(item.messages), name)
        assert item.messages[-1]["role"] == "user", "history must end with the question"
        assert item.category
        assert len(item.messages) >= 4, "the context must be several messages"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reply", ["", "   ", "Connection refused", "Because ...", "B"])
def test_non_answers_are_wrong(name: str, reply: str, tmp_path: Path) -> None:
    task, items = _load(name, tmp_path)
    for item in items:
        grade = task.grade(item, reply)
        assert grade.quality == 0.0, (item.item_id, reply)
        assert grade.grader.startswith(task.grader_version.split("-")[0])


def test_a_built_in_resolves_without_reading_entry_points(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each thread of a concurrent sweep loads its strategy: scanning every installed
    distribution's entry points took tens of ms of CPU each time."""
    from pytest_budgetbench import registry
    from pytest_budgetbench.strategies import REGISTRY as STRATEGIES

    def no_scan(**_: object) -> list[object]:
        raise AssertionError("entry points were read")

    monkeypatch.setattr(registry, "entry_points", no_scan)
    assert STRATEGIES.resolve("truncation").name == "truncation"
    assert REGISTRY.resolve("memory").name == "memory"
    with pytest.raises(AssertionError, match="entry points were read"):
        STRATEGIES.resolve("not-a-built-in")
