#!/usr/bin/env python3
"""Strict accuracy by operation (+ / -) for every eval file in this folder.

Usage: python3 docs/training-evidence/groups8-packed/by-op.py [DIR]
"""
import gzip
import json
import pathlib
import sys

folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent)
for path in sorted(folder.glob("eval-*.jsonl.gz")):
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    cells = []
    for op in (" + ", " - "):
        picked = [r for r in rows if op in r["problem"]]
        cells.append(f"{op.strip()} {sum(r['strict'] for r in picked)}/{len(picked)}")
    print(path.name.removesuffix(".jsonl.gz"), *cells)
