"""The agent sweep's table (docs/agents.md) from a run directory.

    python benchmarks/agent_table.py reports/<run_id>

One line per strategy@budget, from the report's summary table (the same numbers as
report/summary.csv): episodes, accuracy with its 95% bootstrap interval, the violation
rate (episodes a call of which went over budget), calls and tokens per episode, prefix
reuse, and the seconds the episodes took (model and strategy, summed over calls); plus
the share of calls whose tool calls the tool-call parser read from text.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

from pytest_budgetbench.records.store import RunStore
from pytest_budgetbench.reports.builder import compute_report


def _f(value: float, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(
        value, spec)


def parsed_share(run_dir: Path) -> str:
    calls = parsed = 0
    for episode in RunStore(run_dir).episodes().values():  # the last record of each cell
        sent = [c for c in episode.calls if c.cached is not None]
        calls += len(sent)
        parsed += sum(1 for c in sent if c.parsed_tool_calls)
    return f"{parsed} of {calls} sent calls had tool calls read from text"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    rows = RunStore(args.run_dir).rows()
    seconds: dict[tuple[str, int], float] = {}
    for row in rows:
        key = (row["strategy"], int(row["budget"]))
        # strategy_s holds the strategy's auxiliary calls too (they run inside apply()).
        seconds[key] = seconds.get(key, 0.0) + (row.get("model_s") or 0.0) + (
            row.get("strategy_s") or 0.0)
    with tempfile.TemporaryDirectory() as scratch:
        report = compute_report([args.run_dir], Path(scratch))
    print("| strategy@budget | episodes | accuracy [95% CI] | violation rate | calls/episode "
          "| tokens/episode | prefix reuse | model+strategy s (sum) |")
    print("|---|---|---|---|---|---|---|---|")
    for cell in report.summary.to_dict("records"):
        key = (str(cell["strategy"]), int(cell["budget"]))
        interval = (f"[{_f(cell['quality_lo'], '.2f')}, {_f(cell['quality_hi'], '.2f')}]")
        print(f"| {key[0]}@{key[1]} | {int(cell['n_cells'])} | "
              f"{_f(cell['quality_mean'], '.2f')} {interval} | "
              f"{_f(cell['violation_rate'], '.2f')} | {_f(cell['calls_mean'], '.1f')} | "
              f"{_f(cell['total_tokens_mean'], '.0f')} | {_f(cell['prefix_reuse_mean'], '.2f')} | "
              f"{seconds.get(key, 0.0):.0f} |")
    print(parsed_share(args.run_dir))


if __name__ == "__main__":
    main()
