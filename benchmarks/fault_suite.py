"""The fault-injection suite as a table: the scenarios of tests/test_faults.py, run once.

    .venv/bin/python benchmarks/fault_suite.py

Faults are injected by the loopback fake endpoint (500s, 429s with Retry-After, timeouts,
malformed JSON, no choices, null content, dropped connections), sweeps are SIGKILLed and
resumed, one strategy crashes on a third of the items, the endpoint is down, and a dataset
file has a broken line. Rows lost, duplicate rows and graded failures must all be 0.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults import all_scenarios


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tallies = all_scenarios(Path(tmp))
    print(f"{'scenario':<26}{'faults':>7}{'cells':>7}{'done':>6}{'errors':>7}{'lost':>6}"
          f"{'dup':>5}{'graded':>8}{'exit':>6}{'wall s':>8}")
    for t in tallies:
        print(f"{t.scenario:<26}{t.faults_injected:>7}{t.cells:>7}{t.completed:>6}"
              f"{t.errored:>7}{t.rows_lost:>6}{t.duplicate_rows:>5}{t.graded_failures:>8}"
              f"{t.exit_code:>6}{t.wall_s:>8.1f}")
    return 0 if all(t.clean for t in tallies) else 1


if __name__ == "__main__":
    sys.exit(main())
