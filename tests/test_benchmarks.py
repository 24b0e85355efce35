"""The research tools in `benchmarks/` (not installed): the grouped design, the exporter's CPU
alone, auto-cost and its callgrind reading. Each runs as `python -m benchmarks.X`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.procs import run_python


def test_export_cpu_prints_each_stage_per_span_fast_and_general() -> None:
    proc = run_python("from benchmarks.export_cpu import main; raise SystemExit(main())",
                      args=["--steps", "100", "--rounds", "2"], timeout=300)
    figures = {}
    for line in proc.stdout.splitlines():
        match = re.fullmatch(r"([a-z0-9_]+): (-?[0-9.]+)", line)
        assert match, f"not a `name: value` line: {line!r}"
        figures[match[1]] = float(match[2])
    required = ["export_total_us_per_span_fast", "export_total_us_per_span_general", "export_json_line_us_per_span"]
    missing = [name for name in required if name not in figures]
    assert not missing, missing
    assert all(figures[name] > 0 for name in required)


def test_grouped_design_holds_records_for_one_catch_up_a_group_and_alternates_variants(tmp_path) -> None:
    """`python -m benchmarks.grouped`: each group is rounds of a plain and one variant's block (explicit,
    then automatic, by turns), in alternating order, with the worker held off, so every record
    of the group is still in the buffer at its end; then one catch-up (drained and exported
    while plain steps run), and a plain block after it. An automatic group installs once, and
    its plain steps run with detection paused."""
    proc = run_python(f"""
        import itertools, json
        import otel_train
        from otel_train import _runtime
        from benchmarks import grouped
        from otel_train import detect as _detect
        from otel_train.detect import optimizer
        from otel_train.bench.switches import held
        otel_train.init(run_id="groups", output_dir={str(tmp_path)!r})
        worker = _runtime.state().worker
        log = []
        class Work:
            def plain(self):
                kind = "p" if not _detect.installed() else "q" if not optimizer.handles else "A"
                log.append((kind, worker.pending(), held(worker).locked()))
            def instrumented(self, span=None):
                with otel_train.step():
                    with otel_train.span("train.forward"):
                        pass
                log.append(("i", worker.pending(), held(worker).locked()))
        res = grouped.bench_steps_grouped(Work(), 4, 5, 10, auto=True)
        print(json.dumps({{"log": log, "res": {{k: v for k, v in res.items() if k.endswith("groups")}},
                          "installed": _detect.installed()}}))
        otel_train.shutdown()
    """)
    found = json.loads(proc.stdout.splitlines()[-1])
    log = found["log"][6:]  # after 3 warm-up steps of each
    kinds = "".join(kind for kind, _, _ in log)
    # Group 0 (explicit): plain, explicit, then reversed; its catch-up (plain steps until the
    # drain and export are done) and a plain block. Group 1 (automatic): one install, 3
    # untimed steps, then its rounds, the plain blocks paused. Then group 2 explicit, group 3
    # automatic again.
    catch_and_after = r"p{6,}"
    explicit = r"p{5}i{5}i{5}p{5}" + catch_and_after
    automatic = r"A{3}q{5}A{5}A{5}q{5}" + catch_and_after
    assert re.fullmatch(explicit + automatic + explicit + automatic, kinds), kinds
    # Held off: an explicit group's 10 steps (two records each) are all pending at its end.
    first_group = [pending for kind, pending, _ in log[:20] if kind == "i"]
    assert first_group == sorted(first_group) and first_group[-1] - first_group[0] == 9 * 2
    # The worker could not drain during any timed step, only in the catch-ups.
    assert all(held for kind, _, held in log if kind in "iA")
    assert not all(held for kind, _, held in log if kind == "p")
    assert found["res"] == {"groups": 2, "auto_groups": 2}
    assert found["installed"] is False


def test_grouped_design_prints_the_step_targets_from_a_live_receiver() -> None:
    proc = run_python("from benchmarks.grouped import main; raise SystemExit(main())",
                      args=["--quick", "--mode", "process", "--step", "small"], timeout=300)
    figures = dict(line.split(": ") for line in proc.stdout.splitlines())
    assert (figures["design"], figures["groups"], figures["block_steps"], figures["auto_warm_up_steps"]) == (
        "groups", "2", "1", "3")
    for name in ("step_overhead_pct_small", "step_overhead_pct_small_ci95_hi", "step_overhead_pct_auto_small",
                 "step_noise_pct_small", "step_pair_noise_pct_small", "exporter_cpu_us_per_step_small"):
        float(figures[name])
    assert "step_overhead_pct" not in figures and int(figures["receiver_spans"]) > 0
    assert "none dropped" in proc.stderr


def test_a_groups_catch_up_is_charged_beyond_the_plain_rate_around_it_for_its_timed_records() -> None:
    from benchmarks.grouped import group_charge_ns

    # 10 catch-up steps took 14 ms where plain steps took 1.2 ms: 2 ms beyond them.
    assert group_charge_ns(14_000_000, 10, 1.2, 100, 0) == pytest.approx(2_000_000)
    # A quarter of the group's records came from untimed steps: a quarter of it is not charged.
    assert group_charge_ns(14_000_000, 10, 1.2, 75, 25) == pytest.approx(1_500_000)


def test_bench_auto_cost_orders_its_blocks_independently_of_the_epoch() -> None:
    """With 8-step blocks an epoch of the auto-cost loop is two rounds: in alternating order, its
    first step (a new DataLoader iterator) always fell in the same variant's block. Drawn at
    random, each variant comes first about as often in even rounds as in odd ones."""
    from benchmarks.auto_cost import round_orders

    orders = round_orders(400)
    assert set(orders) == {("plain", "auto"), ("auto", "plain")}
    for parity in (0, 1):
        firsts = [order[0] for order in orders[parity::2]]
        assert 0.4 < firsts.count("auto") / len(firsts) < 0.6, parity


def test_bench_auto_cost_prints_its_figures_and_counts_calls() -> None:
    """`python -m benchmarks.auto_cost`: the µs A/B with its interval and the per-step call counts, the
    automatic steps making more Python calls than the plain ones (the hooks are really on)."""
    proc = run_python("from benchmarks.auto_cost import main; raise SystemExit(main())",
                      args=["--rounds", "3", "--block-steps", "1"], timeout=300)
    figures = dict(line.split(": ") for line in proc.stdout.splitlines())
    for name in ("step_us_plain", "auto_us_per_step", "auto_us_per_step_ci95_lo", "auto_us_per_step_ci95_hi", "auto_cpu_us_per_step_ci95_hi",
                 "python_calls_per_step_plain", "python_calls_per_step_auto", "c_calls_per_step_added"):
        assert name in figures, name
    assert float(figures["python_calls_per_step_added"]) > 0
    assert float(figures["torch_threads"]) == 1
    assert "none dropped" in proc.stderr


def test_bench_auto_cost_floor_hooks_in_without_otel_train() -> None:
    """`python -m benchmarks.auto_cost --floor`: no-op hooks where automatic mode hooks in, timed against plain
    steps with no otel_train installed. The hooks are really on (more Python and C calls a
    step), its figures are named `floor_`, and nothing is exported."""
    proc = run_python("from benchmarks.auto_cost import main; raise SystemExit(main())",
                      args=["--rounds", "3", "--block-steps", "1", "--floor"], timeout=300)
    figures = dict(line.split(": ") for line in proc.stdout.splitlines())
    for name in ("step_us_plain", "floor_us_per_step", "floor_us_per_step_ci95_lo", "floor_pct_per_step",
                 "floor_cpu_us_per_step", "python_calls_per_step_floor", "c_calls_per_step_floor"):
        assert name in figures, name
    assert not any(name.startswith("auto_") for name in figures)
    assert float(figures["python_calls_per_step_added"]) > 0
    assert float(figures["c_calls_per_step_added"]) > 0
    assert "otel_train" not in proc.stderr


def test_bench_auto_cost_per_call_times_three_variants_doing_the_same_work() -> None:
    """`python -m benchmarks.auto_cost --per-call`: plain, automatic (batched) and per-call automatic
    blocks in the same rounds, exporting the same spans a step
    (two data, forward and backward spans, the update and the step), `train.other` gaps counted
    apart (how many a step gets follows how long its gaps are); with `--floor` it is refused,
    naming both flags."""
    proc = run_python("from benchmarks.auto_cost import main; raise SystemExit(main())",
                      args=["--rounds", "3", "--block-steps", "1", "--per-call"], timeout=300)
    figures = dict(line.split(": ") for line in proc.stdout.splitlines())
    for name in ("step_us_plain", "auto_us_per_step", "per_call_us_per_step", "per_call_minus_auto_us_per_step",
                 "per_call_minus_auto_us_per_step_ci95_lo", "records_per_step_auto", "records_per_step_per_call",
                 "other_per_step_auto", "other_per_step_per_call"):
        assert name in figures, name
    auto, per_call = float(figures["records_per_step_auto"]), float(figures["records_per_step_per_call"])
    assert auto >= 8 and abs(auto - per_call) <= 0.1, (auto, per_call)  # a GC pause may fall in either epoch
    assert float(figures["other_per_step_auto"]) > 0 and float(figures["other_per_step_per_call"]) > 0
    refused = run_python("from benchmarks.auto_cost import main; raise SystemExit(main())",
                         args=["--per-call", "--floor"], timeout=60, check=False)
    assert refused.returncode == 2 and "--per-call" in refused.stderr and "--floor" in refused.stderr


def test_bench_auto_cost_parts_times_hooks_notes_and_all_in_the_same_rounds() -> None:
    """`python -m benchmarks.auto_cost --parts`: plain, the hooks alone, the notes alone and automatic blocks in
    the same rounds, each figure with its interval; with `--per-call` it is refused, naming both."""
    proc = run_python("from benchmarks.auto_cost import main; raise SystemExit(main())",
                      args=["--rounds", "3", "--block-steps", "1", "--parts"], timeout=300)
    figures = dict(line.split(": ") for line in proc.stdout.splitlines())
    for name in ("step_us_plain", "hooks_us_per_step", "notes_us_per_step", "auto_us_per_step",
                 "notes_minus_hooks_us_per_step", "auto_minus_notes_us_per_step",
                 "auto_minus_notes_us_per_step_ci95_hi", "rounds"):
        assert name in figures, name
    assert figures["rounds"] == "3"
    refused = run_python("from benchmarks.auto_cost import main; raise SystemExit(main())",
                         args=["--parts", "--per-call"], timeout=60, check=False)
    assert refused.returncode == 2 and "--parts" in refused.stderr and "--per-call" in refused.stderr


def test_bench_auto_cost_batch_calls_times_a_batch_size_beside_the_shipped_one() -> None:
    """`python -m benchmarks.auto_cost --batch-calls N`: plain, automatic and automatic with batches of N notes
    in the same rounds, naming both sizes; a size under `SMALL_BATCH` (which would turn batching
    off for the rest of the run) and `--batch-calls` with `--parts` are refused, naming the flag."""
    from otel_train.detect.batch import BATCH_CALLS, SMALL_BATCH

    proc = run_python("from benchmarks.auto_cost import main; raise SystemExit(main())",
                      args=["--rounds", "3", "--block-steps", "4", "--batch-calls", "30"],
                      timeout=300)
    figures = dict(line.split(": ") for line in proc.stdout.splitlines())
    for name in ("step_us_plain", "auto_us_per_step", "batch_calls_us_per_step", "batch_calls_minus_auto_us_per_step",
                 "batch_calls_minus_auto_us_per_step_ci95_hi"):
        assert name in figures, name
    assert (figures["batch_calls"], figures["batch_calls_auto"]) == ("30", str(BATCH_CALLS))
    for args, named in ((["--batch-calls", str(SMALL_BATCH - 1)], f"at least {SMALL_BATCH}"),
                        (["--batch-calls", "100", "--parts"], "--parts")):
        refused = run_python("from benchmarks.auto_cost import main; raise SystemExit(main())",
                             args=[*args], timeout=60, check=False)
        assert refused.returncode == 2 and "--batch-calls" in refused.stderr and named in refused.stderr


def test_bench_auto_cost_root_hooks_times_the_hooks_beside_the_slot() -> None:
    """`python -m benchmarks.auto_cost --root-hooks`: plain, automatic (roots timed from their slots) and the
    roots timed by hooks in the same rounds; with `--batch-calls` it is refused, naming both."""
    proc = run_python("from benchmarks.auto_cost import main; raise SystemExit(main())",
                      args=["--rounds", "3", "--block-steps", "2", "--root-hooks"], timeout=300)
    figures = dict(line.split(": ") for line in proc.stdout.splitlines())
    for name in ("step_us_plain", "auto_us_per_step", "root_hooks_us_per_step", "root_hooks_minus_auto_us_per_step",
                 "root_hooks_minus_auto_us_per_step_ci95_hi"):
        assert name in figures, name
    refused = run_python("from benchmarks.auto_cost import main; raise SystemExit(main())",
                         args=["--root-hooks", "--batch-calls", "100"], timeout=60, check=False)
    assert refused.returncode == 2 and "--root-hooks" in refused.stderr and "--batch-calls" in refused.stderr


def test_root_hooks_swaps_the_slot_for_hooks_inside_the_block_only(tmp_path: Path) -> None:
    """`testing.root_hooks()`: inside, the root carries our hooks and no slot; after, its slot
    again; its forwards are timed throughout."""
    proc = run_python(f"""
        import json, sys, torch
        from torch import nn
        import otel_train
        from otel_train import detect
        from benchmarks.switches import root_hooks
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from support.detect_loop import timed_by as form

        otel_train.init(run_id="swap", output_dir={str(tmp_path)!r})
        detect.install()
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def steps(n):
            for _ in range(n):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
                opt.zero_grad()
        steps(4)
        seen = [form(model)]
        with root_hooks():
            seen.append(form(model))
            steps(2)
        seen.append(form(model))
        steps(2)
        detect.uninstall()
        otel_train.shutdown()
        print(json.dumps(seen))
    """, timeout=120)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["slot", "hooks", "slot"]
    from otel_train.analyze import reader
    assert sum(span.name == "train.forward" for span in reader.iter_spans(reader.find_sources(str(tmp_path)))) == 8


def test_bench_auto_cost_batches_of_sets_the_size_for_its_block_only() -> None:
    """`batches_of(n)`: the batch size a run reads as each batch begins is n inside the block and
    the shipped one after it, even when the block raises."""
    from benchmarks.auto_cost import batches_of
    from otel_train.detect import batch

    shipped = batch.BATCH_CALLS
    with pytest.raises(RuntimeError):
        with batches_of(shipped + 7):
            assert batch.BATCH_CALLS == shipped + 7
            raise RuntimeError("the block failed")
    assert batch.BATCH_CALLS == shipped


def test_bench_auto_cost_noop_hooks_are_all_removed_after() -> None:
    """`noop_hooks` puts back every function it wrapped and removes every hook it added, even
    when its block raises."""
    import torch
    from torch.optim import optimizer
    from torch.utils.data import dataloader

    from benchmarks.auto_cost import AutoCostLoop, noop_hooks

    loop = AutoCostLoop()
    before = (torch.autograd.backward, vars(dataloader._BaseDataLoaderIter)["__next__"],
              vars(torch.optim.Optimizer)["zero_grad"], len(optimizer._global_optimizer_pre_hooks),
              len(optimizer._global_optimizer_post_hooks))
    with pytest.raises(RuntimeError, match="inside"):
        with noop_hooks(loop):
            assert torch.autograd.backward is not before[0]
            assert len(loop.model._forward_pre_hooks) == len(loop.model._forward_hooks) == 1
            loop.step()
            raise RuntimeError("inside")
    after = (torch.autograd.backward, vars(dataloader._BaseDataLoaderIter)["__next__"],
             vars(torch.optim.Optimizer)["zero_grad"], len(optimizer._global_optimizer_pre_hooks),
             len(optimizer._global_optimizer_post_hooks))
    assert after == before
    assert not loop.model._forward_pre_hooks and not loop.model._forward_hooks


def _callgrind_dump(path: Path, events: str, summary: str, totals: str) -> None:
    """A callgrind dump as valgrind 3.19 writes one (its header, one function, its totals)."""
    path.write_text("# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\npid: 7\npart: 3\n\n\n"
                    "desc: LL cache: 2097152 B, 64 B, 16-way associative\n\n"
                    "desc: Trigger: Client Request: auto\n\npositions: line\n"
                    f"events: {events}\nsummary: {summary}\n\n\nob=(1) /x.so\nfl=(2) ???\nfn=(3) f\n"
                    f"0 {summary}\n\n{totals}\n")


def test_bench_auto_cost_reads_every_event_of_a_callgrind_dump(tmp_path: Path) -> None:
    """`--callgrind` reads the dump's summary under its event names (not the `totals:` line,
    which callgrind writes too and which can differ), with or without the simulated caches."""
    from benchmarks.callgrind import events as callgrind_events

    full = tmp_path / "callgrind.out.7.3"
    _callgrind_dump(full, "Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim",
                    "100 20 10 9 8 7 6 5 4 30 3 12 2", "totals: 999 0 0 0 0 0 0 0 0 0 0 0 0")
    assert callgrind_events(str(full)) == {"Ir": 100, "Dr": 20, "Dw": 10, "I1mr": 9, "D1mr": 8, "D1mw": 7,
                                           "ILmr": 6, "DLmr": 5, "DLmw": 4, "Bc": 30, "Bcm": 3, "Bi": 12, "Bim": 2}
    plain = tmp_path / "callgrind.out.7.4"
    _callgrind_dump(plain, "Ir", "1234", "totals: 1234")
    assert callgrind_events(str(plain)) == {"Ir": 1234}
    empty = tmp_path / "callgrind.out.7.5"
    empty.write_text("# callgrind format\nversion: 1\n")
    with pytest.raises(RuntimeError, match="no events"):
        callgrind_events(str(empty))


def test_bench_auto_cost_prints_the_misses_callgrind_simulated() -> None:
    """The figures are the sums of their events a step, per variant and added; a figure whose
    events callgrind did not simulate (no `--cache-sim` / `--branch-sim`) is left out."""
    from benchmarks.callgrind import figures as callgrind_figures

    plain = {"Ir": 1000.0, "I1mr": 10.0, "D1mr": 20.0, "D1mw": 5.0, "ILmr": 3.0, "DLmr": 4.0, "DLmw": 1.0,
             "Bcm": 7.0, "Bim": 2.0}
    auto = {"Ir": 1100.4, "I1mr": 30.0, "D1mr": 25.0, "D1mw": 5.0, "ILmr": 13.0, "DLmr": 9.0, "DLmw": 2.0,
            "Bcm": 17.0, "Bim": 6.0}
    figures = callgrind_figures({"plain": plain, "auto": auto})
    assert figures == {
        "instructions_per_step_plain": 1000, "instructions_per_step_auto": 1100, "instructions_per_step_added": 100,
        "l1_misses_per_step_plain": 35, "l1_misses_per_step_auto": 60, "l1_misses_per_step_added": 25,
        "ll_misses_per_step_plain": 8, "ll_misses_per_step_auto": 24, "ll_misses_per_step_added": 16,
        "ll_instruction_misses_per_step_plain": 3, "ll_instruction_misses_per_step_auto": 13,
        "ll_instruction_misses_per_step_added": 10,
        "branch_mispredicts_per_step_plain": 9, "branch_mispredicts_per_step_auto": 23,
        "branch_mispredicts_per_step_added": 14,
    }
    only_ir = callgrind_figures({"plain": {"Ir": 10.0}, "auto": {"Ir": 12.0}})
    assert only_ir == {"instructions_per_step_plain": 10, "instructions_per_step_auto": 12,
                       "instructions_per_step_added": 2}
    floor = callgrind_figures({"plain": {"Ir": 10.0}, "floor": {"Ir": 11.0}}, "floor")
    assert floor == {"instructions_per_step_plain": 10, "instructions_per_step_floor": 11,
                     "instructions_per_step_added": 1}


# Two functions in libpython (one calling into libc, whose inclusive cost must not count again),
# one in an otel_train extension named first on a `cob=` line, one in libtorch_cpu, and one in
# the main executable; names compressed after their first use, a `fi=` line inside a function.
_GROUPED_DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir ILmr DLmr Bcm Bim
summary: 0

ob=(1) /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0
fl=(1) Objects/dictobject.c
fn=(1) dict_get
10 100 2 3 4 1
+2 50 1
cob=(2) /usr/lib/x86_64-linux-gnu/libc.so.6
cfi=(2) ???
cfn=(2) memcpy
calls=4 0
* 999 99 99 99 99
fi=(3) Include/object.h
5 10 0 1
fn=(4) PyObject_GetAttr
1 20
cob=(5) /work/main/otel_train/detect/_loops.cpython-311-x86_64-linux-gnu.so
cfn=(6) fetch
calls=1 0
* 777 7 7 7 7

ob=(2)
fl=(4) ???
fn=(2)
0 40 0 2

ob=(5)
fl=(5) otel_train/detect/_loops.c
fn=(6)
100 300 30 6 5 2
ob=(7) /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so
fl=(6) ???
fn=(8) mkl_blas_avx2_sgemm_scopy_right24_ea
0 1000 0 60
ob=(8) /root/.pyenv/versions/3.11.7/bin/python3.11
fl=(7) ???
fn=(9) main
0 5
ob=(1)
fn=(1)
12 1 0 0 0 0
"""


def test_bench_callgrind_gives_each_cost_to_its_object_group(tmp_path: Path) -> None:
    """A function's own cost goes to the group of the object it is in (names compressed after
    their first use, `cob=` naming an object first); a call's inclusive cost is not counted
    again; the main executable and libpython are Python, MKL's kernels torch's."""
    from benchmarks.callgrind import events_by_group, group_of

    dump = tmp_path / "callgrind.out.7.1"
    dump.write_text(_GROUPED_DUMP)
    assert events_by_group(str(dump)) == {
        "python": {"Ir": 100 + 50 + 10 + 20 + 5 + 1, "ILmr": 2 + 1, "DLmr": 3 + 1, "Bcm": 4, "Bim": 1},
        "other": {"Ir": 40, "ILmr": 0, "DLmr": 2, "Bcm": 0, "Bim": 0},
        "otel_train": {"Ir": 300, "ILmr": 30, "DLmr": 6, "Bcm": 5, "Bim": 2},
        "torch": {"Ir": 1000, "ILmr": 0, "DLmr": 60, "Bcm": 0, "Bim": 0},
    }
    assert group_of("/usr/lib/python3.11/lib-dynload/_contextvars.cpython-311-x86_64-linux-gnu.so") == "python"
    assert group_of("/x/torch/lib/libc10.so") == "torch"
    assert group_of("/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30") == "other"
    assert group_of("???") == "other"


def test_bench_callgrind_says_where_the_added_cost_lies() -> None:
    """`_added_{group}` is the variant's cost in that group less plain's, for each figure whose
    events were counted; a group only one variant touched still counts."""
    from benchmarks.callgrind import added_by_group

    plain = {"python": {"Ir": 100.0, "ILmr": 1.0, "DLmr": 2.0, "DLmw": 0.0, "Bcm": 5.0, "Bim": 1.0},
             "torch": {"Ir": 1000.0, "ILmr": 10.0, "DLmr": 50.0, "DLmw": 5.0, "Bcm": 9.0, "Bim": 0.0}}
    auto = {"python": {"Ir": 160.4, "ILmr": 4.0, "DLmr": 3.0, "DLmw": 1.0, "Bcm": 8.0, "Bim": 3.0},
            "torch": {"Ir": 990.0, "ILmr": 11.0, "DLmr": 70.0, "DLmw": 5.0, "Bcm": 9.0, "Bim": 0.0},
            "otel_train": {"Ir": 30.0, "ILmr": 6.0, "DLmr": 1.0, "DLmw": 0.0, "Bcm": 2.0, "Bim": 1.0}}
    assert added_by_group({"plain": plain, "auto": auto}) == {
        "instructions_per_step_added_otel_train": 30, "ll_misses_per_step_added_otel_train": 7,
        "branch_mispredicts_per_step_added_otel_train": 3,
        "instructions_per_step_added_python": 60, "ll_misses_per_step_added_python": 5,
        "branch_mispredicts_per_step_added_python": 5,
        "instructions_per_step_added_torch": -10, "ll_misses_per_step_added_torch": 21,
        "branch_mispredicts_per_step_added_torch": 0,
    }
    only_ir = added_by_group({"plain": {"python": {"Ir": 1.0}}, "floor": {"python": {"Ir": 3.0}}}, "floor")
    assert only_ir == {"instructions_per_step_added_python": 2}
