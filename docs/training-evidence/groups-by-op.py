#!/usr/bin/env python3
"""What training saw, by operation: every group the coordinators stored
(`groups-<arm>.jsonl.gz`, written by `train-bench groups --store
coordinator.redb --batches trainer/batches`), split into addition,
subtraction with a result >= 0 and subtraction with a negative result.

Per kind and half of the run: groups, mean reward (T = 0.7), groups whose
rollouts were all wrong, all right, mixed (the only ones GRPO learns from)
and trained on. Then, per kind over the whole run, a beta-binomial fit of
the per-problem pass rate (maximum likelihood on a grid) and what it says
about a group of 16 instead of 8: the share of groups that would be mixed.

Usage: python3 docs/training-evidence/groups-by-op.py DIR   (e.g. docs/training-evidence/groups8-packed)
"""
import pathlib
import sys
from math import exp, lgamma, log

from arith_kinds import KINDS, kind, read_rows

def log_pk(k, n, a, b):
    """log P(k of n right) when the pass rate is Beta(a, b)."""
    lbeta = lambda x, y: lgamma(x) + lgamma(y) - lgamma(x + y)
    return lgamma(n + 1) - lgamma(k + 1) - lgamma(n - k + 1) + lbeta(k + a, n - k + b) - lbeta(a, b)


def fit(ks, n):
    counts = {k: ks.count(k) for k in set(ks)}
    grid = [(i * 0.01, j * 0.05) for i in range(1, 200) for j in range(1, 100)]
    return max(grid, key=lambda ab: sum(c * log_pk(k, n, *ab) for k, c in counts.items()))


def mixed(n, a, b):
    return 1 - exp(log_pk(0, n, a, b)) - exp(log_pk(n, n, a, b))


if len(sys.argv) != 2:
    sys.exit(__doc__)
folder = pathlib.Path(sys.argv[1])
for path in sorted(folder.glob("groups-*.jsonl.gz")):
    rows = read_rows(str(path))
    size = len(rows[0]["rewards"])
    last = max(r["window"] for r in rows) + 1
    print(f"{path.name}: {len(rows)} groups of {size} in {last} windows")
    for lo, hi in ((0, last // 2), (last // 2, last)):
        for k in KINDS:
            g = [r for r in rows if lo <= r["window"] < hi and kind(r["problem"]) == k]
            if not g:
                continue
            mean = sum(sum(r["rewards"]) / len(r["rewards"]) for r in g) / len(g)
            z0 = sum(all(x == 0 for x in r["rewards"]) for r in g)
            z1 = sum(all(x == 1 for x in r["rewards"]) for r in g)
            tr = sum(r["trained"] > 0 for r in g)
            print(f"  windows {lo:2}-{hi - 1:2} {k:6}  groups {len(g):3}  mean reward {mean:.3f}"
                  f"  all wrong {z0:3}  all right {z1:3}  mixed {len(g) - z0 - z1:3}  trained {tr:3}")
    if "control" in path.name:
        continue
    for k in KINDS:
        ks = [round(sum(r["rewards"])) for r in rows if kind(r["problem"]) == k]
        a, b = fit(ks, size)
        seen = sum(0 < x < size for x in ks) / len(ks)
        print(f"  {k:6} pass rate ~ Beta({a:.2f}, {b:.2f}): mixed groups seen {seen:.2f},"
              f" fit {mixed(size, a, b):.2f} at {size}, {mixed(2 * size, a, b):.2f} at {2 * size}")
