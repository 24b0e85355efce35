"""What becomes of a latency result (`latency.measure_latency`): a table and a JSON file.

Its metrics (`bench.latency`, `bench.throughput.*`) are not made here: the exporter derives
them from the timed spans, like every other metric of the run (`export.metrics`), so they go
where the run's metrics go with the run's resource (docs/bench-latency.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otel_train.bench.latency import PHASES

_LABELS = {"forward": "forward", "forward_backward": "forward+backward"}


def format_table(result: Mapping[str, Any], name: str | None = None) -> str:
    """The result as a plain-text table (milliseconds; throughput of the mean latency); `name`
    says what was measured."""
    batch = result["batch"]
    size = f"batch {batch['batch_size']}"
    if batch.get("seq_len") is not None:
        size += f" x {batch['seq_len']} tokens"
    timer = "device events" if result["timer"] == "device_events" else "host perf_counter"
    lines = [
        f"Latency{' of ' + name if name else ''} on synthetic batches ({result['device']}, {result.get('dtype')}, "
        f"{timer})",
        f"{size}; {result['warmup']} warm-up + {result['iters']} timed batches per phase",
        "",
    ]
    header = ("phase", "mean ± std (ms)", "p50 (ms)", "p90 (ms)", "tokens/s", "samples/s")
    rows = [header]
    for phase in PHASES:
        if phase not in result["phases"]:
            continue
        res = result["phases"][phase]
        lat = res["latency_s"]
        rows.append((_LABELS[phase], f"{lat['mean'] * 1e3:.3f} ± {lat['std'] * 1e3:.3f}", f"{lat['p50'] * 1e3:.3f}",
                     f"{lat['p90'] * 1e3:.3f}", _rate(res.get("tokens_per_s")), _rate(res.get("samples_per_s"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def write_json(result: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write `result` (indented) to `path`, creating its folder; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out)  # whole or absent: a reader never sees half a file
    return out
