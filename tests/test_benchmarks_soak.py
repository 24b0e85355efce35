"""`python -m benchmarks.soak`, as a smoke run: it runs, prints its figures, and its short run
delivers every span it made (the figures are the command's to give)."""

from __future__ import annotations

from support.procs import run_python

SOAK = "from benchmarks.soak import main; raise SystemExit(main())"


def _figures(stdout: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)


def test_bench_soak_delivers_every_span_and_samples_both_processes(tmp_path) -> None:
    proc = run_python(SOAK, args=["--minutes", "0.05", "--sample-s", "0.5"], cwd=tmp_path,
                      timeout=240)
    figures = _figures(proc.stdout)
    assert int(figures["steps"]) > 0 and figures["spans_delivered"] == figures["spans_made"], proc.stdout
    for name in ("trainer.rss_mb.last", "exporter.threads.max", "trainer.fds.settled"):
        assert float(figures[name]) > 0, proc.stdout
