"""Load a run: trace files into `RunData` (several processes at once for big runs), then metrics.

Each rank's file reduces independently, so a big run's files are split among worker processes
(spawned, so it is safe from a threaded caller) and the reduced parts merged: the parts are
~100 bytes per step, far less than the JSON they came from. Small runs read in-process.
"""

from __future__ import annotations

import os
from array import array
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from otel_train import semconv
from otel_train.analyze import reader
from otel_train.analyze.model import RunData, build, settle

#: Below this much JSON, starting workers costs more than it saves.
PARALLEL_MIN_BYTES = 48 << 20
#: Pipeline gauges read for the verdict: each process's last value, summed over processes (the
#: actors' capacities add up to what the pipeline can supply; the trainer ranks' to what it takes).
_CAPACITIES = (semconv.METRIC_INFER_CAPACITY, semconv.METRIC_TRAIN_CAPACITY, semconv.METRIC_PIPELINE_THROUGHPUT)


def load(sources: reader.Sources, stats: reader.Stats, workers: int | None = None, run_id: str | None = None
         ) -> tuple[RunData, dict[str, float]]:
    """(the run's data, its capacities' last values); `workers` None picks by size and cores;
    `run_id` keeps one run of a dump holding several (else several runs are an `InputError`)."""
    files = list(sources.traces)
    if workers is None:
        size = sum(f.stat().st_size for f in files)
        workers = min(os.cpu_count() or 1, 8, len(files)) if size >= PARALLEL_MIN_BYTES else 1
    if workers <= 1 or len(files) < 2:
        data = build(reader.iter_blocks(sources, stats, run_id), stats)
    else:
        chunks = [files[i::workers] for i in range(workers)]
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            parts = list(pool.map(_build_files, chunks, [run_id] * len(chunks)))
        data = RunData()
        for part, part_stats in parts:
            _merge(data, part)
            stats.lines += part_stats.lines
            stats.bad_lines += part_stats.bad_lines
            stats.spans += part_stats.spans
    runs = sorted(data.run_ids)
    if len(runs) > 1:
        raise reader.InputError(f"{sources.label}: holds {len(runs)} runs ({', '.join(runs[:8])}"
                                f"{', ...' if len(runs) > 8 else ''}); name one with --run RUN_ID")
    return data, _read_metrics(sources, data, stats, run_id)


def _build_files(paths: list[Path], run_id: str | None) -> tuple[RunData, reader.Stats]:
    stats = reader.Stats()
    sources = reader.Sources(paths, [], "")
    return build(reader.iter_blocks(sources, stats, run_id), stats), stats


def _merge(into: RunData, part: RunData) -> None:
    for key, per in part.steps.items():
        mine = into.steps.setdefault(key, {})
        for n, rs in per.items():
            if n in mine:  # one process's step split across files: keep both halves' phases
                other = mine[n]
                if other.dev is not None or rs.dev is not None:
                    other.dev = (other.dev or array("q", [-1] * 2 * len(other.codes))) + \
                        (rs.dev or array("q", [-1] * 2 * len(rs.codes)))
                other.codes.extend(rs.codes)
                other.times.extend(rs.times)
                other.has_span = other.has_span or rs.has_span
                other.links = other.links or rs.links
                other.finish()
            else:
                mine[n] = rs
        settle(mine)
    into.siblings.extend(part.siblings)
    into.pipeline.extend(part.pipeline)
    for key, proc in part.processes.items():
        into.processes.setdefault(key, proc)
    for key, t in part.first_ns.items():
        into.first_ns[key] = min(t, into.first_ns.get(key, t))
    for key, t in part.last_ns.items():
        into.last_ns[key] = max(t, into.last_ns.get(key, t))
    for name, n in part.other_spans.items():
        into.other_spans[name] = into.other_spans.get(name, 0) + n
    into.spans += part.spans
    into.run_ids |= part.run_ids


def _read_metrics(sources: reader.Sources, data: RunData, stats: reader.Stats, run_id: str | None
                  ) -> dict[str, float]:
    """Each process's `otel_train.init` (its metric points' earliest start) into `data`; the
    capacities' last values, summed over processes."""
    last: dict[tuple[str, str], tuple[int, float]] = {}
    init = data.init_ns
    for p in reader.iter_metric_points(sources, stats, run_id):
        if p.proc.role != semconv.ROLE_INFERENCE and p.start:
            key = (p.proc.rank, p.proc.restart)
            if p.start < init.get(key, p.start + 1):
                init[key] = p.start
        if p.name in _CAPACITIES:
            k = (p.name, p.proc.instance)
            if k not in last or p.time >= last[k][0]:
                last[k] = (p.time, p.value)
    out: dict[str, list[float]] = {}
    for (name, _), (_, value) in last.items():
        out.setdefault(name, []).append(value)
    return {name: sum(v) for name, v in out.items()}
