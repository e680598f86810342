#!/usr/bin/env python3
"""How training's rollouts fail, by operation: for a `train-bench groups
--completions MODEL.gguf` file, each rollout's final `Answer:` value
against the problem's answer: right; the right magnitude with the wrong
sign; off by one or ten; no well-formed final Answer line; otherwise wrong.
Per half of the run and kind (addition, subtraction with a result >= 0,
with a negative result), the share of rollouts of each kind of outcome.
Training's rollouts only: nothing here reads a held-out column.

Usage: python3 docs/training-evidence/failmodes.py docs/training-evidence/alone24/completions-seed-b.jsonl.gz
"""
import sys
from collections import Counter

from arith_kinds import KINDS, final_answer, kind, read_rows

path = sys.argv[1]
rows = read_rows(path)
last = max(r["window"] for r in rows) + 1
for lo, hi in ((0, last // 2), (last // 2, last)):
    stats = {}
    for r in rows:
        if not (lo <= r["window"] < hi):
            continue
        k = kind(r["problem"])
        want = int(r["answer"])
        c = stats.setdefault(k, Counter())
        for text in r["completions"]:
            got = final_answer(text)
            if got is None:
                c["no answer line"] += 1
                continue
            if got == want:
                c["right"] += 1
            elif got == -want:
                c["sign flipped"] += 1
            elif abs(got - want) in (1, 10) or abs(abs(got) - abs(want)) in (1, 10):
                c["off by 1 or 10"] += 1
            else:
                c["other wrong"] += 1
    print(f"windows {lo}-{hi - 1}")
    for k in KINDS:
        c = stats.get(k, Counter())
        n = sum(c.values())
        parts = ", ".join(f"{name} {c[name] / n:.2f}" for name in
                          ("right", "sign flipped", "off by 1 or 10", "other wrong", "no answer line"))
        print(f"  {k:6} rollouts {n:5}: {parts}")
