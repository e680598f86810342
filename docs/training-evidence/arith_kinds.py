"""The kinds of a level-105 arith problem the evidence scripts split by, and
how they read their files and a completion's final answer (imported by
groups-by-op.py, failmodes.py and trained-groups.py, which run from this
folder)."""
import gzip
import json
import re

KINDS = ("add", "sub>=0", "sub<0")


def kind(problem):
    """`Compute a + b.` is "add"; `Compute a - b.` is "sub>=0" or "sub<0" by its result's sign."""
    e = problem.removeprefix("Compute ").rstrip(".")
    if " + " in e:
        return "add"
    a, b = map(int, e.split(" - "))
    return "sub>=0" if a >= b else "sub<0"


def read_rows(path):
    """The rows of a JSONL file, gzip-compressed or not."""
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        return [json.loads(line) for line in f]


ANSWER_LINE = re.compile(r"^Answer: (-?\d+)$")


def final_answer(text):
    """N of a completion whose last non-empty line is `Answer: N`, else None."""
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    m = ANSWER_LINE.match(lines[-1]) if lines else None
    return int(m.group(1)) if m else None
