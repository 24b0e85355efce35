"""`otel-train` command line: the overhead benchmark runs and prints every figure machine-readably."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.procs import run_python

REQUIRED = ["region_ns_floor", "region_ns_otel_train", "region_ns_otel_sdk", "region_ns_disabled",
            "sdk_over_otel_train", "step_ms_plain", "step_ms_instrumented", "step_overhead_pct",
            "step_ms_plain_small", "step_ms_instrumented_small", "step_overhead_pct_small",
            "exporter_cpu_us_per_step", "worker_cpu_us_per_step", "receiver_spans",
            "step_overhead_pct_ci95_lo", "step_overhead_pct_ci95_hi",
            "step_overhead_pct_small_ci95_lo", "step_overhead_pct_small_ci95_hi",
            "region_ns_cold_floor", "region_ns_cold_otel_train", "region_ns_cold_otel_sdk",
            "region_ns_cold_disabled", "sdk_over_otel_train_cold", "step_overhead_pct_small_hot_path",
            "step_overhead_pct_small_hot_path_ci95_lo", "step_overhead_pct_small_hot_path_ci95_hi", "hot_path_in_c",
            ]

#: With the C hot path built, its pure-Python fallback beside it.
PYTHON_FALLBACK = ["region_ns_otel_train_python", "region_ns_cold_otel_train_python",
                   "step_overhead_pct_small_hot_path_python", "step_overhead_pct_small_hot_path_python_ci95_lo",
                   "step_overhead_pct_small_hot_path_python_ci95_hi"]


#: With two intra-op threads or more, the small step again with one thread fewer.
SPARE_CORE = ["torch_threads_spare_core", "step_overhead_pct_small_spare_core",
              "step_overhead_pct_small_spare_core_ci95_lo", "step_overhead_pct_small_spare_core_ci95_hi"]


def test_bench_overhead_prints_every_figure_as_name_value() -> None:
    proc = run_python("from otel_train.cli import main; raise SystemExit(main())",
                      args=["bench", "overhead", "--quick", "--mode", "process"], timeout=300)
    figures = {}
    for line in proc.stdout.splitlines():
        match = re.fullmatch(r"([a-z0-9_]+): (-?[0-9.]+)", line)
        assert match, f"not a `name: value` line: {line!r}"
        figures[match[1]] = float(match[2])
    required = (REQUIRED + (SPARE_CORE if figures["torch_threads"] >= 2 else [])
                + (PYTHON_FALLBACK if figures["hot_path_in_c"] else []))
    missing = [name for name in required if name not in figures]
    assert not missing, missing
    assert figures["receiver_spans"] > 0  # the instrumented steps really reached the live receiver
    assert "none dropped" in proc.stderr


def test_targets_only_times_just_the_judged_blocks() -> None:
    """`--targets-only`: plain, instrumented and automatic blocks of the chosen step, at the
    block size asked for, and none of the other figures."""
    proc = run_python("from otel_train.cli import main; raise SystemExit(main())",
                      args=["bench", "overhead", "--quick", "--mode", "process", "--step", "small",
                            "--targets-only", "--block-steps", "6"], timeout=300)
    figures = dict(line.split(": ") for line in proc.stdout.splitlines())
    for name in ("step_overhead_pct_small", "step_overhead_pct_small_ci95_hi", "step_overhead_pct_auto_small",
                 "step_overhead_pct_auto_small_ci95_hi", "step_noise_pct_small", "receiver_spans"):
        assert name in figures, name
    assert (figures["block_steps"], figures["block_steps_small"]) == ("6", "36")
    for name in ("region_ns_otel_train", "step_ms_sdk_small",
                 "step_overhead_pct_small_hot_path", "step_overhead_pct_small_spare_core", "step_overhead_pct"):
        assert name not in figures, name
    assert int(figures["receiver_spans"]) > 0


def test_automatic_blocks_share_the_rounds_of_the_plain_and_instrumented_ones(tmp_path) -> None:
    """Automatic blocks run in the same rounds as the plain and explicit ones, in alternating
    order, with the hooks installed for exactly their steps (2 warm-up steps and the timed
    ones); their catch-up steps run without hooks, and nothing stays installed."""
    proc = run_python(f"""
        import itertools, json
        import otel_train
        from otel_train.bench import blocks
        from otel_train import detect as _detect
        from otel_train.instrumentation import TorchTrainingInstrumentor
        otel_train.init(run_id="auto-rounds", output_dir={str(tmp_path)!r})
        log = []
        installs = [0]  # each automatic block installs anew: its steps are told apart by it
        instrument = TorchTrainingInstrumentor.instrument
        def counted(self, **kwargs):
            installs[0] += 1
            return instrument(self, **kwargs)
        TorchTrainingInstrumentor.instrument = counted
        class Work:
            def plain(self):
                # A catch-up can take no step (its flush done before the first), so two
                # automatic blocks may follow each other with no plain step between them.
                log.append(f"A{{installs[0]}}" if _detect.installed() else "p")
            def instrumented(self, span=None):
                log.append("i")
        res = blocks.bench_steps(Work(), 3, 5, auto=True)
        runs = [(kind[0], len(list(group))) for kind, group in itertools.groupby(log)]
        print(json.dumps({{"runs": [r for r in runs if r[0] != "p"], "keys": sorted(res),
                          "installed": _detect.installed()}}))
        otel_train.shutdown()
    """)
    found = json.loads(proc.stdout.splitlines()[-1])
    # 3 warm-up steps of each (interleaved), then rounds plain-explicit-auto, reversed, forward.
    assert [kind for kind, _ in found["runs"]] == ["i"] * 3 + ["i", "A", "A", "i", "i", "A"]
    assert [n for kind, n in found["runs"] if kind == "A"] == [2 + 5] * 3
    assert {"auto", "auto_overhead_pct", "auto_ci95_pct"} <= set(found["keys"])
    assert found["installed"] is False


def test_bench_device_runs_plain_instrumented_and_automatic_loops() -> None:
    """On this CPU build: the three loops, no synchronising call in any, and the phases found by
    automatic detection as the explicit spans mark them (three a step, its discovery steps too)."""
    proc = run_python("from otel_train.cli import main; raise SystemExit(main())",
                      args=["bench", "device", "--steps", "4"], timeout=300)
    figures = dict(re.fullmatch(r"([a-z0-9_]+): (-?[0-9.]+)", line).groups()  # type: ignore[union-attr]
                   for line in proc.stdout.splitlines())
    assert {name: float(figures[f"syncs_{name}"]) for name in ("plain", "instrumented", "automatic")} == {
        "plain": 0, "instrumented": 0, "automatic": 0}
    assert float(figures["phase_spans_instrumented"]) == 3 * 4
    assert float(figures["phase_spans_automatic"]) == 3 * (4 + 6)
    assert all(float(figures[f"step_ms_{name}"]) > 0 for name in ("plain", "instrumented", "automatic"))


@pytest.mark.parametrize("argv,message", [
    (["bench"], "required"),
    (["bench", "overhead", "--mode", "fast"], "invalid choice"),
    (["bench", "device", "--steps", "0"], "--steps must be a positive integer"),
    (["bench", "overhead", "--rounds", "2"], "--rounds must be an integer >= 3"),
    (["bench", "overhead", "--step", "medium"], "invalid choice"),
    (["bench", "overhead", "--block-steps", "4"], "--block-steps must be an integer >= 5"),
    (["bench", "overhead", "--block-steps", "x"], "invalid int value"),
    (["bench", "overhead", "--design", "groups"], "unrecognized arguments"),
    (["bench", "auto-cost"], "invalid choice"),
    (["bench", "startup", "--steps", "0"], "otel-train bench startup: error: --steps must be a positive integer"),
    (["bench", "startup", "--step-ms", "-2"], "--step-ms must be a positive number of milliseconds"),
    (["bench", "startup", "--loop", "lightning"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_cli_arguments_get_one_clear_message(argv: list[str], message: str) -> None:
    proc = run_python("from otel_train.cli import main; raise SystemExit(main())", args=argv, check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_quickstart_example_leaves_traces_on_the_embedded_default(tmp_path) -> None:
    from pathlib import Path

    from otel_train.export.otlp_json import read_spans

    example = Path(__file__).resolve().parent.parent / "examples" / "quickstart.py"
    proc = run_python(script=example, args=["--steps", "20"], cwd=tmp_path, env={"OTEL_TRAIN_RUN_ID": "qs"})
    assert "traces and metrics are in otel-train/qs/" in proc.stdout
    spans = list(read_spans(tmp_path / "otel-train" / "qs" / "traces-rank0.jsonl"))
    steps = {s["attributes"]["train.step"]: s for s in spans if s["name"] == "train.step"}
    assert sorted(steps) == list(range(20))
    # 'slow' (over the median + 3 MAD of recent steps) is a wall-clock verdict: a loaded host may add it.
    tags = steps[19]["attributes"]["train.step.tags"]
    assert [tag for tag in tags if tag != "slow"] == ["checkpoint", "eval"], tags
    assert sum(s["name"] == "train.forward" for s in spans) == 40


def test_overhead_interval_is_the_binomial_order_statistics_around_the_median() -> None:
    from otel_train.bench.stats import paired_ci95_pct, run_alternating

    # Ratios 0 %, 1 %, ... in shuffled rounds: the interval is read off the sorted ratios.
    plain = [2.0] * 15
    other = [2.0 * (1 + k / 100) for k in (7, 3, 14, 0, 9, 1, 12, 5, 2, 13, 4, 11, 6, 10, 8)]
    lo, hi = paired_ci95_pct(plain, other)
    assert (round(lo, 6), round(hi, 6)) == (3.0, 11.0)  # the 4th and 12th of 15 (96.5 % coverage)
    lo, hi = paired_ci95_pct(plain[:9], [2.0 * (1 + k / 100) for k in range(9)])
    assert (round(lo, 6), round(hi, 6)) == (1.0, 7.0)  # the 2nd and 8th of 9 (96.1 %)
    lo, hi = paired_ci95_pct([1.0] * 3, [1.0, 1.1, 1.2])  # too few rounds: the whole range
    assert (round(lo, 6), round(hi, 6)) == (0.0, 20.0)
    order: list[str] = []
    run_alternating(3, [lambda: order.append("a"), lambda: order.append("b")])
    assert order == ["a", "b", "b", "a", "a", "b"]


def test_a_blocks_leftover_work_is_caught_up_while_plain_steps_run_and_charged_beyond_them() -> None:
    import threading

    from otel_train.bench.blocks import Block, catch_up

    finished = threading.Event()
    ran: list[int] = []

    def plain() -> None:  # the fifth plain step lets the leftover work finish
        ran.append(1)
        if len(ran) == 5:
            finished.set()

    elapsed_ns, steps, _ = catch_up(lambda: finished.wait(30), plain)
    # Plain steps ran until the work was done (and until the loop saw it), every one counted.
    assert steps == len(ran) >= 5 and elapsed_ns > 0

    block = Block(10, 10_000_000)  # 10 steps in 10 ms
    block.catch_ns, block.catch_steps = 7_000_000, 5  # then 5 plain steps took 7 ms, not 5
    assert block.ms_per_step(plain_ms=1.0) == pytest.approx(1.2)  # the 2 ms beyond them are the block's
    assert Block(10, 10_000_000).ms_per_step(plain_ms=1.0) == pytest.approx(1.0)
