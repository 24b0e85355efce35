"""`report`: one self-contained HTML page of a run (no network needed to view it).

The page (`report_template.html`: plain SVG drawn by a few hundred lines of inline JavaScript,
no library) shows the verdict, a Gantt of steps x ranks (each phase coloured, the device lane
under the host lane, checkpoint / eval / GC marked, slow steps highlighted, the straggler
outlined), the phase breakdown over steps, goodput, the stragglers and the clock correction.

What is drawn is bounded whatever the run's size, and the page says what was left out:

- the Gantt holds up to `WINDOW_STEPS` consecutive steps per window, for a few windows (the
  first steps, the slowest step, the worst straggler step, the last steps), and up to
  `MAX_RANKS` ranks (the stragglers, then ranks spread evenly);
- the phase chart draws one bar per step up to `MAX_BARS` steps, else one bar per bucket of
  consecutive steps (their mean);
- slow and straggler steps beyond `MAX_LISTED` are counted, not listed.

So a 10,000-step, 8-rank run makes a page of a few hundred KB.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

from otel_train.analyze.diagnose import Diagnosis, to_json
from otel_train.analyze.goodput import CATEGORIES
from otel_train.analyze.model import OUTSIDE, PHASES, RankStep, RunData, actor_names
from otel_train.analyze.skew import Skew
from otel_train.analyze.slow import median

WINDOW_STEPS = 24
MAX_RANKS = 32
MAX_BARS = 600
MAX_LISTED = 200


def _ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def pick_ranks(ranks: list[int], first: list[int], limit: int = MAX_RANKS) -> list[int]:
    """Up to `limit` ranks: those in `first` (stragglers), then evenly spread, in rank order."""
    if len(ranks) <= limit:
        return list(ranks)
    chosen = [r for r in first if r in ranks][:limit // 2]
    rest = [r for r in ranks if r not in chosen]
    room = limit - len(chosen)
    stride = len(rest) / room
    chosen += [rest[int(i * stride)] for i in range(room)]
    return sorted(set(chosen))


def _windows(d: Diagnosis) -> list[tuple[str, list[int]]]:
    steps = d.steps
    if len(steps) <= WINDOW_STEPS:
        return [("all steps", steps)]
    index = {n: i for i, n in enumerate(steps)}

    def around(n: int) -> list[int]:
        i = min(max(0, index[n] - WINDOW_STEPS // 2), len(steps) - WINDOW_STEPS)
        return steps[i:i + WINDOW_STEPS]

    out = [("first steps", steps[:WINDOW_STEPS])]
    later = [n for n in steps if n not in d.warmup] or steps
    slowest = max(later, key=lambda n: d.job_step_ns[n])
    out.append((f"around the slowest step ({slowest})", around(slowest)))
    late = [(st.late_ns, s.step) for s in d.step_ranks for st in s.stragglers[:1]]
    if late:
        worst = max(late)[1]
        out.append((f"around the worst straggler step ({worst})", around(worst)))
    out.append(("last steps", steps[-WINDOW_STEPS:]))
    seen, unique = set(), []
    for title, w in out:
        if tuple(w) not in seen:
            seen.add(tuple(w))
            unique.append((title, w))
    return unique


def _window(d: Diagnosis, title: str, steps: list[int], ranks: list[int], by_step: dict[int, dict[int, RankStep]]
            ) -> dict[str, Any]:
    skew: Skew = d.skew
    data: RunData = d.data
    t0 = min(rs.start - skew.of(r) for n in steps for r, rs in by_step[n].items())
    t1 = max(rs.end - skew.of(r) for n in steps for r, rs in by_step[n].items())
    chosen = set(steps)
    late = {(st.rank, s.step): st for s in d.step_ranks if s.step in chosen for st in s.stragglers}
    rows = []
    for r in ranks:
        off = skew.of(r) + t0
        row: dict[str, Any] = {"rank": r, "steps": [], "host": [], "device": [], "marks": []}
        for n in steps:
            rs = by_step[n].get(r)
            if rs is None:
                continue
            st = late.get((r, n))
            row["steps"].append([n, _ms(rs.start - off), _ms(rs.duration), _ms(st.late_ns) if st else 0,
                                 list(rs.tags)])
            row["host"] += [[PHASES.index(name), _ms(a - off), _ms(b - a)] for name, a, b in rs.phases()]
            row["device"] += [[PHASES.index(name), _ms(a - off), _ms(b - a)] for name, a, b in rs.device_phases()]
        rows.append(row)
    for s in data.siblings:
        if s.step in chosen and s.rank in ranks:
            row = rows[ranks.index(s.rank)]
            off = skew.of(s.rank) + t0
            row["marks"].append([s.name.split(".")[-1], _ms(s.start - off), _ms(s.end - s.start)])
    # Inference actors as their own lanes: their calls in the window, on the reference clock
    # as written (actors are not skew-corrected: no collective ties them to the ranks).
    actors: dict[str, list[list[float]]] = {name: [] for name in actor_names(data.pipeline).values()}
    names = actor_names(data.pipeline)
    for p in data.pipeline:
        name = names.get((p.instance, p.rank))
        if name is not None and p.end > t0 and p.start < t1:
            actors[name].append([_ms(max(p.start, t0) - t0), _ms(min(p.end, t1) - max(p.start, t0))])
    return {"title": title, "steps": steps, "span_ms": _ms(t1 - t0), "rows": rows,
            "actors": [[name, calls] for name, calls in actors.items()],
            "slow": [n for n in steps if n in d.severity],
            "severity": {n: round(d.severity[n], 3) for n in steps if n in d.severity}}


def _phase_series(d: Diagnosis, by_step: dict[int, dict[int, RankStep]]) -> dict[str, Any]:
    """Mean over ranks of each phase's time per step, bucketed to at most MAX_BARS bars."""
    steps = d.steps
    per_step = []
    for n in steps:
        per = by_step[n]
        sums = [0.0] * (len(PHASES) + 1)
        for rs in per.values():
            for code, ns in enumerate(rs.totals):
                sums[code] += ns
            sums[-1] += max(0, rs.duration - sum(rs.totals))
        per_step.append([v / len(per) for v in sums])
    bucket = max(1, -(-len(steps) // MAX_BARS))
    bars, slow = [], []
    for i in range(0, len(steps), bucket):
        chunk = per_step[i:i + bucket]
        bars.append([steps[i], steps[min(i + bucket, len(steps)) - 1]] +
                    [_ms(sum(c[k] for c in chunk) / len(chunk)) for k in range(len(PHASES) + 1)])
        found = [d.severity[n] for n in steps[i:i + bucket] if n in d.severity]
        if found:  # every slow step gets its dot, however many steps a bar holds
            slow.append([len(bars) - 1, len(found), round(max(found), 3)])
    return {"bucket": bucket, "bars": bars, "slow": slow}


def report_data(d: Diagnosis) -> dict[str, Any]:
    """Everything the page draws, as JSON values."""
    by_step = d.data.by_step()
    stragglers = [s.rank for s in d.ranks_verdict.stragglers]
    ranks = pick_ranks(d.ranks, stragglers)
    summary = to_json(d)
    present = [i for i, name in enumerate(PHASES) if name in d.shares]
    notes = []
    windows = [_window(d, title, w, ranks, by_step) for title, w in _windows(d)]
    if len(d.steps) > WINDOW_STEPS:
        notes.append(f"The timeline shows {len(windows)} windows of up to {WINDOW_STEPS} consecutive steps out of "
                     f"{len(d.steps)}; the phase chart below covers every step.")
    if len(ranks) < len(d.ranks):
        notes.append(f"The timeline shows {len(ranks)} of {len(d.ranks)} ranks: the stragglers, then ranks spread "
                     f"evenly.")
    series = _phase_series(d, by_step)
    if series["bucket"] > 1:
        notes.append(f"Each bar of the phase chart is the mean of {series['bucket']} consecutive steps.")
    per_step = summary.pop("per_step")
    straggler_steps = [[x["step"], x["stragglers"][0]["rank"], round(x["stragglers"][0]["late_s"] * 1e3, 3)]
                       for x in per_step if x["stragglers"]]
    return {
        "summary": summary,
        "median_step_ms": _ms(median(list(d.job_step_ns.values()))) if d.job_step_ns else 0.0,
        "phases": list(PHASES) + [OUTSIDE],
        "present_phases": present + [len(PHASES)],
        "categories": list(CATEGORIES),
        "ranks_drawn": ranks,
        "windows": windows,
        "series": series,
        "slow_steps": d.slow_steps[:MAX_LISTED],
        "straggler_steps": straggler_steps[:MAX_LISTED],
        "straggler_steps_total": len(straggler_steps),
        "has_device": any(row["device"] for w in windows for row in w["rows"]),
        "notes": notes,
    }


def render(d: Diagnosis) -> str:
    """The page's HTML."""
    template = resources.files("otel_train.analyze").joinpath("report_template.html").read_text("utf-8")
    payload = json.dumps(report_data(d), separators=(",", ":")).replace("</", "<\\/")
    title = html.escape(f"otel-train report: {d.run_id or d.source}")
    return template.replace("__TITLE__", title).replace("__HEADLINE__", html.escape(d.headline)) \
        .replace("__DATA__", payload)


def write_report(d: Diagnosis, path: str | Path) -> int:
    """Write the page to `path`; return its size in bytes."""
    text = render(d)
    Path(path).write_text(text, encoding="utf-8")
    return len(text.encode("utf-8"))
