"""The package's imports form layers: every import points down, and none forms a cycle.

Read from the package's own source with ``ast``, so every import counts: one at the top of
a module, a lazy one inside a function, and one under ``if TYPE_CHECKING:`` too (it never
runs, but it still ties the two modules together for whoever reads or moves them).
"""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

import pytest

import pytest_budgetbench

PACKAGE = "pytest_budgetbench"
ROOT = Path(pytest_budgetbench.__file__).parent

# Lowest first, a package per layer: what a cell passes through, from the bottom up. A
# module's layer is that of the longest prefix listed here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("messages", "errors", "redact", "lexicon", "options", "canonical", "registry"),
    ("sweep", "settings", "records"),
    ("model", "cache", "tokens", "embedded_server", "embeddings"),
    ("tasks", "strategies", "reports"),
    # testing holds its stand-in auxiliary model to the budget through engine.calls.
    ("engine", "testing"),
    ("commands",),
    ("pytest_face",),
    ("plugin",),
)
# Subpackages of one layer that must not import one another.
SIBLINGS = ("tasks", "strategies", "reports")
# The sanctioned crossings: report extensions of strategy families build on the reports layer.
ALLOWED_CROSSINGS = {("strategies.budgetmem.report", "reports"),
                     ("strategies.memory_report", "reports"),
                     ("strategies.frameworks.report", "reports")}
# Imports still to remove, each (importer, imported); everything else is held strictly.
KNOWN: set[tuple[str, str]] = set()
"""Imports excused from the rules while a change that removes them is under way: each
entry names its issue, and test_known_offenders_are_still_there drops stale ones."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The package modules ``path`` imports (relative to the package, '' for the root)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                target = name[len(PACKAGE) + 1:]
                if target and _exists(target):
                    found.add(target)
    return found


def _exists(module: str) -> bool:
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def layer_of(module: str) -> int:
    best, layer = -1, -1
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, layer = len(name), index
    return layer


SOURCE = {
    module_name(path): imports_of(path) - {module_name(path)}
    for path in sorted(ROOT.rglob("*.py"))
}
GRAPH = {module: {t for t in targets if (module, t) not in KNOWN}
         for module, targets in SOURCE.items()}


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in GRAPH if m and layer_of(m) < 0)
    assert not unplaced, f"add these modules to LAYERS: {unplaced}"


def test_imports_point_down() -> None:
    upward = [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in GRAPH.items() if module
        for target in targets if target and layer_of(target) > layer_of(module)
    ]
    assert not upward, "\n".join(upward)


def test_tasks_strategies_and_reports_do_not_import_each_other() -> None:
    crossings = []
    for module, targets in GRAPH.items():
        home = module.split(".")[0]
        for target in targets:
            there = target.split(".")[0]
            if home in SIBLINGS and there in SIBLINGS and home != there and not any(
                module.startswith(src) and there == dst for src, dst in ALLOWED_CROSSINGS
            ):
                crossings.append(f"{module} imports {target}")
    assert not crossings, "\n".join(crossings)


def _cycle() -> list[str] | None:
    """A cycle among modules, parent packages excluded (a package's __init__ importing its
    own submodules is how a package exposes them, not a cycle)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target in sorted(GRAPH.get(module, ())):
            if module.startswith(target + ".") or not target:
                continue
            if state.get(target) == 1:
                return [*stack[stack.index(target):], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_import_cycle() -> None:
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle or [])


MAX_FLOORS = 12
"""The most modules one import chain may pass through, importer and bottom included: a
change in the bottom module of a chain reaches every module above it, and a reader follows
a chain floor by floor (issue 32)."""


def _longest_chain() -> list[str]:
    """The longest import chain, from its importer down; a module's import of its own parent
    package is left out, as in :func:`_cycle` (a cycle would cut a chain short here, and
    :func:`test_no_import_cycle` reports it)."""
    longest: dict[str, list[str]] = {}
    visiting: set[str] = set()

    def chain(module: str) -> list[str]:
        if module in longest:
            return longest[module]
        if module in visiting:
            return [module]
        visiting.add(module)
        below = [chain(target) for target in sorted(GRAPH.get(module, ()))
                 if target and not module.startswith(target + ".")]
        visiting.discard(module)
        longest[module] = [module, *max(below, key=len, default=[])]
        return longest[module]

    return max((chain(module) for module in sorted(GRAPH)), key=len, default=[])


def test_the_import_graph_is_at_most_12_floors_deep() -> None:
    chain = _longest_chain()
    assert len(chain) <= MAX_FLOORS, (
        f"{len(chain)} floors (at most {MAX_FLOORS}): {' -> '.join(chain)}; cut a floor where "
        "an import is only for a type or a helper that can live lower"
    )


def test_the_floor_count_sees_a_long_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain planted through lazy imports is measured whole, a package's own __init__
    not counted as a floor below its submodules."""
    planted = [f"engine.planted{i}" for i in range(MAX_FLOORS)]
    for importer, imported in pairwise(planted):
        monkeypatch.setitem(GRAPH, importer, {imported, "engine"})
    monkeypatch.setitem(GRAPH, planted[-1], {"errors"})
    assert _longest_chain() == [*planted, "errors"]


def test_known_offenders_are_still_there() -> None:
    """An entry of KNOWN whose import is gone is removed, so it cannot excuse a new one."""
    stale = sorted(f"{m} -> {t}" for m, t in KNOWN if t not in SOURCE.get(m, set()))
    assert not stale, f"remove from KNOWN: {stale}"


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The graph is read from source: a planted lazy upward import is found, and so is one
    under ``if TYPE_CHECKING:``, at the top of a module or inside a function."""
    planted = tmp_path / "mod.py"
    planted.write_text("def f():\n    from pytest_budgetbench import plugin\n")
    assert imports_of(planted) == {"plugin"}
    guarded = tmp_path / "typed.py"
    guarded.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from pytest_budgetbench import plugin\n"
        "def f():\n    if TYPE_CHECKING:\n        import pytest_budgetbench.engine.session\n"
    )
    assert imports_of(guarded) == {"plugin", "engine.session"}


def test_the_checker_sees_a_cycle_through_type_checking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle closed only by an ``if TYPE_CHECKING:`` import is still a cycle."""
    typed = tmp_path / "typed.py"
    typed.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from pytest_budgetbench.plugin import SESSION_KEY\n")
    monkeypatch.setitem(GRAPH, "engine.session", {*GRAPH["engine.session"], *imports_of(typed)})
    monkeypatch.setitem(GRAPH, "plugin", {*GRAPH["plugin"], "engine.session"})
    assert _cycle() is not None


@pytest.mark.parametrize("module", ["plugin", "engine.runner", "tokens.gguf", "sweep.cells",
                                    "cache.responses", "reports.gates.items"])
def test_known_modules_are_placed(module: str) -> None:
    assert layer_of(module) >= 0


def test_every_module_opens_with_its_job() -> None:
    """A newcomer's map: each module's docstring opens with the one job it does."""
    silent = [module_name(path) or PACKAGE for path in sorted(ROOT.rglob("*.py"))
              if not (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "")
              .strip().splitlines()[:1]]
    assert not silent, f"open these modules with a docstring that says their job: {silent}"


def test_every_package_is_on_the_architecture_map() -> None:
    """docs/architecture.md names each package with its sentence, so the map and the tree
    cannot drift apart."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = sorted(module_name(path.parent) for path in ROOT.rglob("__init__.py")
                      if path.parent != ROOT)
    missing = [name for name in packages if f"{name.replace('.', '/')}/" not in page]
    assert not missing, f"docs/architecture.md does not name: {missing}"


# -- the tests mirror the packages ---------------------------------------------------------
TESTS = Path(__file__).resolve().parent
# The test files that stay at tests/: each tests a root module or the package as a whole.
ROOT_TESTS = {
    "test_ci_workflow.py": "docs/examples/budgetbench.yml, the whole in a CI job",
    "test_core_install.py": "the install without extras",
    "test_cpu_flags.py": ".ci/cpu-flags, the install's llama.cpp build flags",
    "test_declared_options.py": "options.py (declared options)",
    "test_docs_examples.py": "the README and the manual",
    "test_errors.py": "errors.py",
    "test_extras.py": "the whole without an optional extra",
    "test_faults.py": "the whole under injected faults",
    "test_kept_llama_server.py": ".ci/kept-llama-server, the install's kept llama-server",
    "test_kept_wheel.py": ".ci/kept-wheel, the install's kept llama.cpp wheel",
    "test_layers.py": "the import graph",
    "test_messages.py": "messages.py",
    "test_plugin.py": "plugin.py, end to end",
    "test_redact.py": "redact.py",
}


def _test_folders() -> list[Path]:
    return sorted(p.parent for p in TESTS.rglob("__init__.py")
                  if p.parent != TESTS and "__pycache__" not in p.parts)


def test_every_test_folder_is_named_for_a_package() -> None:
    folders = _test_folders()
    assert folders, "no test folder found"
    for folder in folders:
        package = ROOT.joinpath(*folder.relative_to(TESTS).parts)
        assert (package / "__init__.py").is_file(), (
            f"tests/{folder.relative_to(TESTS).as_posix()}/ mirrors no package: name it "
            f"for the {PACKAGE} package it tests")


def test_every_folder_of_tests_is_a_package() -> None:
    # A folder without __init__.py would be imported under its bare name, and a test file
    # in it could not import the helpers as tests.<module>.
    for path in TESTS.rglob("test_*.py"):
        assert (path.parent / "__init__.py").is_file(), f"{path.parent} has no __init__.py"


def test_only_tests_of_a_root_module_or_the_whole_sit_at_the_root() -> None:
    at_root = {path.name for path in TESTS.glob("test_*.py")}
    assert at_root <= set(ROOT_TESTS), (
        f"move {sorted(at_root - set(ROOT_TESTS))} into the folder of the package each "
        "tests (tests/engine/, tests/model/, ...), or add it to ROOT_TESTS with what it tests")
    assert set(ROOT_TESTS) <= at_root, (
        f"ROOT_TESTS names missing files: {sorted(set(ROOT_TESTS) - at_root)}")
