"""Summarise the last `mutmut run` (make mutation): the score per module and every mutant that was not killed.

A mutant counts as killed when a test failed on it or it ran past mutmut's timeout (an infinite loop is a
detected change). "no tests" means no selected test reaches the mutated function: it counts against the
score, since nothing would notice the change. Every mutant left alive must be explained in
``tests/mutation_equivalent.toml`` (mutant name = why no test can tell it from the original); the report lists
the ones that are not ("unexplained": write a test that kills it, or the reason) and the explanations whose
mutant was killed or no longer exists ("stale": mutant numbers shift when a function changes).

Reads `mutmut results --all true` (run it from the repository root after `mutmut run`) and writes the score
and the list to ``bench/results/mutation.json``, which the book's results page shows. Exits 1 when no results
exist or a mutant is unexplained.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from _results import RESULTS, save_section  # noqa: E402

LINE = re.compile(r"^\s*(?P<name>[\w.ǁ]+__mutmut_\d+): (?P<status>.+)$")
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
EQUIVALENT = ROOT / "tests" / "mutation_equivalent.toml"


def module_of(mutant: str) -> str:
    """``agent_lab.estimators.aggregation.x_aggregate__mutmut_3`` -> ``agent_lab.estimators.aggregation``."""
    return mutant.rsplit(".", 1)[0]


def parse(results: str) -> dict[str, str]:
    """Mutant name -> status, from the text of `mutmut results --all true`."""
    return {m.group("name"): m.group("status").strip() for m in map(LINE.match, results.splitlines()) if m}


def score_rows(statuses: dict[str, str]) -> list[dict]:
    """One row per module and a last row "all": mutants, killed, score and the other statuses' counts."""
    by_module: dict[str, Counter] = defaultdict(Counter)
    for mutant, status in statuses.items():
        by_module[module_of(mutant)][status] += 1
    total = sum(by_module.values(), Counter())
    rows = []
    for module, counts in [*sorted(by_module.items()), ("all", total)]:
        n, killed = sum(counts.values()), sum(counts[s] for s in KILLED)
        rows.append({"module": module, "mutants": n, "killed": killed, "score": killed / n,
                     "other": ", ".join(f"{s} {c}" for s, c in sorted(counts.items()) if s not in KILLED)})
    return rows


def not_killed(statuses: dict[str, str], reasons: dict[str, str]) -> tuple[list[dict], list[str]]:
    """The live mutants, each with its explanation or None; and the stale explanations."""
    alive = [{"mutant": m, "status": s, "reason": reasons.get(m)} for m, s in statuses.items() if s not in KILLED]
    stale = sorted(m for m in reasons if statuses.get(m) in KILLED or m not in statuses)
    return alive, stale


def main() -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    out = subprocess.run([str(mutmut), "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    statuses = parse(out)
    if not statuses:
        print("no mutation results: run `mutmut run` (make mutation) first")
        return 1
    reasons = tomllib.loads(EQUIVALENT.read_text())["equivalent"]
    rows = score_rows(statuses)
    print(f"{'module':40s} {'mutants':>8s} {'killed':>8s} {'score':>7s}   other")
    for r in rows:
        print(f"{r['module']:40s} {r['mutants']:8d} {r['killed']:8d} {r['score']:7.1%}   {r['other']}")
    alive, stale = not_killed(statuses, reasons)
    unexplained = [a for a in alive if a["reason"] is None]
    print(f"\n{len(alive)} mutants not killed, {len(unexplained)} of them unexplained (`mutmut show NAME`):")
    for a in alive:
        print(f"  {a['mutant']}: {a['status']}: {a['reason'] or 'UNEXPLAINED'}")
    for m in stale:
        print(f"  stale explanation (killed or gone): {m}")
    command = "make mutation"
    save_section(RESULTS / "mutation.json", "score", rows, command)
    save_section(RESULTS / "mutation.json", "not_killed", alive, command)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
