"""The fault-injection suite as a table: the scenarios of tests/test_faults.py, run once.

    .venv/bin/python benchmarks/fault_suite.py

Faults are injected by the loopback fake endpoint (500s, 429s with Retry-After, timeouts,
malformed JSON, no choices, null content, dropped connections), sweeps are SIGKILLed and
resumed, one strategy crashes on a third of the items, the endpoint is down, a dataset
file has a broken line, an API key and URL credentials are planted (and echoed back by the
server), Retry-After is extreme, the baseline has nothing comparable, and the disk fills
(a 200 KB tmpfs; left out where mounting is not allowed). Rows lost, duplicate rows,
graded failures (infrastructure failures graded as answers) and secret hits must all be 0.
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
    print(f"{'scenario':<34}{'faults':>7}{'cells':>7}{'done':>6}{'errors':>7}{'lost':>6}"
          f"{'dup':>5}{'graded':>8}{'secrets':>9}{'exit':>6}{'wall s':>8}")
    for t in tallies:
        print(f"{t.scenario:<34}{t.faults_injected:>7}{t.cells:>7}{t.completed:>6}"
              f"{t.errored:>7}{t.rows_lost:>6}{t.duplicate_rows:>5}{t.graded_failures:>8}"
              f"{t.secret_hits:>9}{t.exit_code:>6}{t.wall_s:>8.1f}")
    return 0 if all(t.clean for t in tallies) else 1


if __name__ == "__main__":
    sys.exit(main())
