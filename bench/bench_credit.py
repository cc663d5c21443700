"""Multi-turn credit assignment against the exact answer: every estimator of agent_lab.credit_exact on number
search under three fixed policies, at one episode budget, compared with the exact A^pi and the exact gradient.

For each policy (uniform among the candidates; the default transformer after a few supervised steps, trained
here with a fixed seed; an optimal policy) and each estimator it prints and saves: episodes per estimate
(branching's continuations counted), the per-turn advantage's MSE, squared bias and variance against
A^pi(h_t, a_t), and the policy-gradient estimate's gain along the exact gradient (1 = unbiased), its variance
relative to the exact gradient's squared norm, that variance at unit gain, and the mean cosine to the exact
gradient. The critic's explained variance is printed beside.

    .venv/bin/python bench/bench_credit.py            # quick: 200 replicates of 64 episodes, K = 2
    .venv/bin/python bench/bench_credit.py --full     # 1000 replicates, budgets 64 and 256, K = 2 and 4

Figures go to bench/results/bench_credit.json (section "quick" or "full", with the command, date, machine and
commit); book/part2/06_credit_assignment.md runs the same comparison at a smaller size.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _results import save_section

from agent_lab.credit_exact import ESTIMATORS, Estimator, compare, reference_policies
from agent_lab.envs import NumberSearchDP

RESULTS = Path(__file__).resolve().parent / "results" / "bench_credit.json"
QUICK = {"replicates": 200, "budgets": (64,), "ks": (2,)}
FULL = {"replicates": 1000, "budgets": (64, 256), "ks": (2, 4)}


def estimators_for(ks: tuple[int, ...]) -> dict[str, tuple[Estimator, int]]:
    """Every estimator once; branching once per K (its name then says K)."""
    out = {}
    for name, est in ESTIMATORS.items():
        for k in ks if est.branching else ks[:1]:
            out[f"{name} K={k}" if est.branching else name] = (est, k)
    return out


def run(policy_name: str, table, dp: NumberSearchDP, budget: int, ks: tuple[int, ...], replicates: int,
        seed: int, critic_episodes: int) -> dict:
    row = {"policy": policy_name, "budget": budget, "estimators": {}}
    for k in ks:
        chosen = {n: e for n, (e, kk) in estimators_for(ks).items() if kk == k}
        start = time.perf_counter()
        out = compare(table, dp, budget=budget, k=k, replicates=replicates, seed=seed,
                      critic_episodes=critic_episodes, estimators=chosen)
        row["estimators"].update(out.results)
        row.setdefault("exact", out.exact)
        row.setdefault("settings", {})[f"k={k}"] = {**out.settings, "seconds": round(time.perf_counter() - start, 1)}
    return row


def print_row(row: dict) -> None:
    ex = row["exact"]
    print(f"\n{row['policy']}: J = {ex['J']:.4f}, E[T] = {ex['expected_turns']:.3f}, ||grad J||^2 = "
          f"{ex['grad_norm_sq']:.3g}, budget {row['budget']} episodes"
          + (f"; critic EV vs exact V {ex['critic_ev_vs_exact_values']:.3f}, vs returns "
             f"{ex['critic_ev_vs_returns']:.3f} (exact V: {ex['exact_values_ev_vs_returns']:.3f})"
             if "critic_ev_vs_exact_values" in ex else ""))
    print(f"  {'estimator':34s} {'episodes':>8s} {'turn MSE':>9s} {'bias^2':>8s} {'var':>8s} {'gain':>13s} "
          f"{'var/|g|^2':>10s} {'at gain 1':>10s} {'cosine':>7s}")
    for name, r in row["estimators"].items():
        gain = f"{r['grad_gain']:.3f}+-{r['grad_gain_se']:.3f}" if "grad_gain" in r else "   (g* = 0)"
        rel = f"{r['grad_variance_rel']:10.2f}" if "grad_variance_rel" in r else f"{r['grad_variance']:10.2e}"
        unit = f"{r['grad_variance_at_unit_gain']:10.2f}" if "grad_variance_at_unit_gain" in r else " " * 10
        t = r["turn"]
        print(f"  {name:34s} {r['episodes_per_estimate']:8.1f} {t['mse']:9.4f} {t['bias_sq']:8.4f} "
              f"{t['variance']:8.4f} {gain:>13s} {rel} {unit} {r.get('grad_cosine', float('nan')):7.3f}")


def save(section: str, rows: list[dict], command: str) -> None:
    save_section(RESULTS, section, rows, command)


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The estimators' rows, by the section of bench/results/bench_credit.json they were saved as (or, with
    ``--no-save``, would have been)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="1000 replicates, budgets 64 and 256, K = 2 and 4")
    parser.add_argument("--replicates", type=int, default=None, help="override the number of replicate batches")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft-steps", type=int, default=10, help="supervised steps of the partly trained policy")
    parser.add_argument("--critic-episodes", type=int, default=2048, help="earlier episodes the critic is fitted on")
    parser.add_argument("--no-save", action="store_true", help="print only")
    args = parser.parse_args(argv)
    plan = FULL if args.full else QUICK
    replicates = args.replicates or plan["replicates"]
    dp = NumberSearchDP(16, 4)
    start = time.perf_counter()
    rows = []
    for name, policy in reference_policies(dp, args.sft_steps, args.seed).items():
        table = dp.policy_table(policy)
        for budget in plan["budgets"]:
            rows.append(run(name, table, dp, budget, plan["ks"], replicates, args.seed, args.critic_episodes))
            print_row(rows[-1])
    print(f"\n{time.perf_counter() - start:.0f} s in all")
    section = "full" if args.full else "quick"
    if not args.no_save:
        command = "python bench/bench_credit.py " + " ".join(argv if argv is not None else sys.argv[1:])
        save(section, rows, command.strip())
        print(f"saved to {RESULTS}")
    return {section: rows}


if __name__ == "__main__":
    main()
