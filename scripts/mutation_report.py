"""Summarise the last `mutmut run` (make mutation): the score per module and every mutant that was not killed.

A mutant counts as killed when a test failed on it or it ran past mutmut's timeout (an infinite loop is a
detected change). "no tests" means no selected test reaches the mutated function: it counts against the
score, since nothing would notice the change. Reads `mutmut results --all true`; run it from the repository
root after `mutmut run`. Exits 1 when no results exist.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*(?P<name>[\w.]+)__mutmut_\d+: (?P<status>.+)$")
KILLED = {"killed", "timeout", "caught by type check", "segfault"}


def module_of(mutant: str) -> str:
    """``agent_lab.estimators.aggregation.x_aggregate__mutmut_3`` -> ``agent_lab.estimators.aggregation``."""
    return mutant.rsplit(".", 1)[0]


def main() -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    out = subprocess.run([str(mutmut), "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    by_module: dict[str, Counter] = defaultdict(Counter)
    left: list[tuple[str, str]] = []
    for line in out.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        mutant = line.strip().split(":")[0]
        status = match.group("status").strip()
        by_module[module_of(mutant)][status] += 1
        if status not in KILLED:
            left.append((mutant, status))
    if not by_module:
        print("no mutation results: run `mutmut run` (make mutation) first")
        return 1
    total = Counter()
    print(f"{'module':40s} {'mutants':>8s} {'killed':>8s} {'score':>7s}   other")
    for module in sorted(by_module):
        counts = by_module[module]
        total.update(counts)
        n, killed = sum(counts.values()), sum(counts[s] for s in KILLED)
        other = ", ".join(f"{s} {c}" for s, c in sorted(counts.items()) if s not in KILLED)
        print(f"{module:40s} {n:8d} {killed:8d} {killed / n:7.1%}   {other}")
    n, killed = sum(total.values()), sum(total[s] for s in KILLED)
    print(f"{'all':40s} {n:8d} {killed:8d} {killed / n:7.1%}")
    print(f"\n{len(left)} mutants not killed (`mutmut show NAME` prints the change):")
    for mutant, status in left:
        print(f"  {mutant}: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
