#!/usr/bin/env python3
"""The groups a trainer stepped on, from a `train-bench groups --trainer DIR
--completions MODEL.gguf` file: per kind (addition, subtraction with a
result >= 0, with a negative result), how many groups, how many had
exactly one rollout with reward < 1, and of the rollouts with reward 1
how many end with `Answer: N` for the problem's N. Meant for the
format-only control, whose reward 1 means "well formed", value ignored.
Training's rollouts only: nothing here reads a held-out column.

Usage: python3 docs/training-evidence/trained-groups.py docs/training-evidence/sub118/completions-control.jsonl.gz
"""
import sys
from collections import Counter

from arith_kinds import KINDS, final_answer, kind, read_rows

path = sys.argv[1]
rows = [r for r in read_rows(path) if r["trained"]]
stats = {k: Counter() for k in KINDS}
for r in rows:
    s = stats[kind(r["problem"])]
    s["groups"] += 1
    s["one_low"] += sum(x < 1 for x in r["rewards"]) == 1
    for text, x in zip(r["completions"], r["rewards"]):
        if x < 1:
            continue
        s["paid"] += 1
        s["right"] += final_answer(text) == int(r["answer"])
total = sum(stats.values(), Counter())
for name, s in list(stats.items()) + [("all", total)]:
    share = 100 * s["right"] / s["paid"] if s["paid"] else 0.0
    print(f"{name:7} groups {s['groups']:3}  one rollout below 1: {s['one_low']:3}  "
          f"paid {s['paid']:4}  right among paid {s['right']:4} ({share:.0f} %)")
