"""Callgrind dumps read for `python -m benchmarks.auto_cost --callgrind`: the figures it prints.

A dump (`callgrind.out.PID.K`, valgrind 3.19's format) names its events on an `events:` line
and totals them on a `summary:` line. Its body lists each function's own cost, line by line,
under the object (`ob=`) the function is in; a `calls=` line is followed by one line of the
callee's inclusive cost, which is the callee's own cost counted again, so it is skipped.
Names are compressed: `ob=(6) /path` the first time, `ob=(6)` after (a `cob=` line, the
callee's object, may name it first).
"""

from __future__ import annotations

import glob
import os
import re

#: The figures printed, each the sum of these callgrind events. Only `Ir` is always there; the
#: misses come with `--cache-sim=yes`, the mispredictions with `--branch-sim=yes`.
FIGURES: dict[str, tuple[str, ...]] = {
    "instructions": ("Ir",),
    "l1_misses": ("I1mr", "D1mr", "D1mw"),
    "ll_misses": ("ILmr", "DLmr", "DLmw"),
    "ll_instruction_misses": ("ILmr",),
    "branch_mispredicts": ("Bcm", "Bim"),
}

#: The figures also given apart by where the cost lies (`OBJECT_GROUPS`).
BY_OBJECT = ("instructions", "ll_misses", "branch_mispredicts")

#: Where a cost lies, by the file name of its object (the first group that matches):
#: otel_train's extensions; the interpreter and its own extensions; torch with the libraries it
#: brings (MKL is linked into libtorch_cpu); anything else (libc, the loader, libstdc++).
OBJECT_GROUPS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("otel_train", re.compile(r"/otel_train/")),
    ("python", re.compile(r"(^|/)(libpython[0-9.]*\.so|python[0-9.]*$)|/lib-dynload/")),
    ("torch", re.compile(r"/(libtorch|libc10|libgomp|libshm|libiomp|libmkl)[^/]*$")),
    ("other", re.compile(r"")),
)

_NAMED = re.compile(r"(ob|cob|fn|cfn|fl|fi|fe|cfi|cfl)=\((\d+)\)(?: (.*))?$")


def events(path: str) -> dict[str, int]:
    """The event totals of one dump (its `summary:` line, named by its `events:` line)."""
    names: list[str] = []
    with open(path) as f:
        for line in f:
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith(("summary:", "totals:")) and names:
                return dict(zip(names, (int(v) for v in line.split()[1:])))
    raise RuntimeError(f"no events or totals in {path}")


def group_of(obj: str) -> str:
    """The group (`OBJECT_GROUPS`) of an object's path."""
    return next(name for name, pattern in OBJECT_GROUPS if pattern.search(obj))


def events_by_group(path: str) -> dict[str, dict[str, int]]:
    """Each group's own cost in one dump, by event (the groups that had any)."""
    names: list[str] = []
    objects: dict[str, str] = {}
    totals: dict[str, list[int]] = {}
    current: list[int] | None = None
    skip = False
    with open(path) as f:
        for line in f:
            first = line[:1]
            if first.isdigit() or first in "+-*":
                if skip:  # the inclusive cost of the call just named
                    skip = False
                elif current is not None:
                    for i, value in enumerate(line.split()[1:]):
                        current[i] += int(value)
                continue
            if line.startswith("calls="):
                skip = True
                continue
            if line.startswith("events:"):
                names = line.split()[1:]
                continue
            named = _NAMED.match(line.rstrip("\n"))
            if named is None:
                continue
            kind, number, name = named.groups()
            if kind in ("ob", "cob") and name is not None:
                objects[number] = name
            if kind == "ob":
                group = group_of(objects.get(number, ""))
                current = totals.setdefault(group, [0] * len(names))
    return {group: dict(zip(names, values)) for group, values in totals.items()}


def figures(per_step: dict[str, dict[str, float]], label: str = "auto") -> dict[str, float]:
    """`{figure}_per_step_plain` / `_{label}` / `_added` for each of `FIGURES` whose events both
    variants counted, from each variant's events a step (`per_step["plain"]`, `per_step[label]`)."""
    out: dict[str, float] = {}
    for figure, needed in FIGURES.items():
        if not all(e in per_step[v] for e in needed for v in ("plain", label)):
            continue
        plain, other = (sum(per_step[v][e] for e in needed) for v in ("plain", label))
        out[f"{figure}_per_step_plain"] = round(plain)
        out[f"{figure}_per_step_{label}"] = round(other)
        out[f"{figure}_per_step_added"] = round(other - plain)
    return out


def added_by_group(per_step: dict[str, dict[str, dict[str, float]]], label: str = "auto") -> dict[str, float]:
    """`{figure}_per_step_added_{group}` for each of `BY_OBJECT` and each group either variant
    had (`per_step[variant][group][event]`, events a step): where what `label` adds lies."""
    out: dict[str, float] = {}
    for group, _ in OBJECT_GROUPS:
        plain, other = per_step["plain"].get(group, {}), per_step[label].get(group, {})
        if not plain and not other:
            continue
        for figure in BY_OBJECT:
            needed = FIGURES[figure]
            if not all(e in plain or e in other for e in needed):
                continue
            added = sum(other.get(e, 0) - plain.get(e, 0) for e in needed)
            out[f"{figure}_per_step_added_{group}"] = round(added)
    return out


def newest_dump(before: set[str]) -> str:
    """The dump callgrind wrote for this process since `before` was listed."""
    new = sorted(set(glob.glob(f"callgrind.out.{os.getpid()}*")) - before, key=os.path.getmtime)
    return new[-1]
