"""`otel-train bench startup`, as smoke runs of its quick mode: both loops run in fresh
processes, plain and instrumented, and every figure is printed as `name: value` (the figures
are the command's to give: no wall-clock assert)."""

from __future__ import annotations

import pytest
from support.procs import run_python

CLI = "from otel_train.cli import main; raise SystemExit(main())"


@pytest.mark.parametrize("loop", ["explicit", "auto"])
def test_bench_startup_times_the_first_steps_both_ways(tmp_path, loop: str) -> None:
    proc = run_python(CLI, args=["bench", "startup", "--quick", "--loop", loop], cwd=tmp_path, timeout=300)
    figures = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert (figures["loop"], figures["rounds"]) == (loop, "1")
    timed = [f"{mode}.step{n}_ms" for mode in ("plain", "instrumented") for n in range(3)]
    assert [name for name in figures if ".step" in name] == timed
    for name in (*timed, "plain.first3_total_ms", "instrumented.first3_thread_cpu_ms",
                 "instrumented.import_and_init_ms", "ratio.first3_total", "ratio.first3_thread_cpu"):
        assert float(figures[name]) > 0, proc.stdout
    if loop == "explicit":  # the exporter process said when it was ready
        assert float(figures["instrumented.exporter_ready_after_init_s"]) > 0, proc.stdout
    assert not list(tmp_path.iterdir())  # the timed runs' files went to a directory of their own
