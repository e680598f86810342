"""The kinds of a level-105 arith problem the evidence scripts split by
(imported by groups-by-op.py and failmodes.py, which run from this folder)."""

KINDS = ("add", "sub>=0", "sub<0")


def kind(problem):
    """`Compute a + b.` is "add"; `Compute a - b.` is "sub>=0" or "sub<0" by its result's sign."""
    e = problem.removeprefix("Compute ").rstrip(".")
    if " + " in e:
        return "add"
    a, b = map(int, e.split(" - "))
    return "sub>=0" if a >= b else "sub<0"
