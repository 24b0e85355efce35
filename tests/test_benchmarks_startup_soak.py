"""`python -m benchmarks.startup` and `benchmarks.soak`, as smoke runs: they run, print their figures,
and the soak's short run delivers every span it made (the figures are the commands' to give)."""

from __future__ import annotations

from support.procs import run_python

STARTUP = "from benchmarks.startup import main; raise SystemExit(main())"
SOAK = "from benchmarks.soak import main; raise SystemExit(main())"


def _figures(stdout: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)


def test_bench_startup_times_the_first_steps_both_ways(tmp_path) -> None:
    proc = run_python(STARTUP, args=["--rounds", "1", "--steps", "3", "--step-ms", "2"],
                      cwd=tmp_path, timeout=240)
    figures = _figures(proc.stdout)
    for name in ("plain.step0_ms", "instrumented.step2_ms", "plain.first3_total_ms",
                 "instrumented.import_and_init_ms", "ratio.first3_total"):
        assert float(figures[name]) > 0, proc.stdout


def test_bench_soak_delivers_every_span_and_samples_both_processes(tmp_path) -> None:
    proc = run_python(SOAK, args=["--minutes", "0.05", "--sample-s", "0.5"], cwd=tmp_path,
                      timeout=240)
    figures = _figures(proc.stdout)
    assert int(figures["steps"]) > 0 and figures["spans_delivered"] == figures["spans_made"], proc.stdout
    for name in ("trainer.rss_mb.last", "exporter.threads.max", "trainer.fds.settled"):
        assert float(figures[name]) > 0, proc.stdout
