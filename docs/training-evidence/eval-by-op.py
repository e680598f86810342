#!/usr/bin/env python3
"""The held-out columns by operation: strict accuracy of every evaluation in
an evidence folder (`eval-<model>-<prompt>-<column>.jsonl.gz`, written by
`train-bench eval`), split into addition, subtraction with a result >= 0 and
subtraction with a negative result.

One row per column and kind: its problems, then each evaluation's right
answers and share (the base's prompts first, then every arm's), so a gain can
be read per kind. Every evaluation of a column must hold the same problems in
the same order; a folder where they differ is an error, not a table.

Usage: python3 docs/training-evidence/eval-by-op.py DIR   (e.g. docs/training-evidence/alone24)
"""
import pathlib
import sys

from arith_kinds import KINDS, kind, read_rows

COLUMNS = ("test", "band", "ood")

if len(sys.argv) != 2:
    sys.exit(__doc__)
folder = pathlib.Path(sys.argv[1])
evals = {}
for path in sorted(folder.glob("eval-*.jsonl.gz")):
    rows = read_rows(str(path))
    if not rows:
        continue
    name = f"{rows[0]['model']} {rows[0]['prompt']}"
    evals.setdefault(rows[0]["column"], {})[name] = rows
if not evals:
    sys.exit(f"{folder}: no eval-*.jsonl.gz")

names = sorted({n for col in evals.values() for n in col}, key=lambda n: (not n.startswith("base "), n))
print("| column | kind | n | " + " | ".join(names) + " |")
print("|---|---|---|" + "---|" * len(names))
for column in COLUMNS:
    col = evals.get(column)
    if not col:
        continue
    problems = None
    for name, rows in col.items():
        these = [r["problem"] for r in rows]
        if problems is not None and these != problems:
            sys.exit(f"{column}: {name} holds other problems than the column's first evaluation")
        problems = these
    for k in KINDS:
        idx = [i for i, p in enumerate(problems) if kind(p) == k]
        cells = []
        for name in names:
            rows = col.get(name)
            if rows is None:
                cells.append("–")
                continue
            right = sum(rows[i]["strict"] for i in idx)
            cells.append(f"{right} ({100 * right / len(idx):.1f} %)" if idx else "–")
        print(f"| {column} | {k} | {len(idx)} | " + " | ".join(cells) + " |")
