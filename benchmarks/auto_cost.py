"""`python -m benchmarks.auto_cost`: what automatic instrumentation costs the training thread a step.

The loop of issue 31: a plain CPU MLP fed by a `DataLoader`, gradient accumulation 2, AdamW,
one intra-op thread (~1.8 ms a step on the shared 2-core VM). Automatic instrumentation is
installed once; plain steps run with every hook and patch removed
(`otel_train.bench.switches.paused_detection()`, untimed), alternating block by block with automatic
steps in one process, the worker held (the records wait in the buffer; they are written out
between rounds, untimed). So the figure is the training thread's own cost, not export.

Each round runs its two blocks in an order drawn at random (seeded: `round_orders`), not in
alternating order: with 8-step blocks (the default until 2026-11-28) an epoch of 32 steps was two
rounds, so alternating put every epoch's first step (a new `DataLoader` iterator and its
shuffle) in the same variant's block each time. An A/A run (both blocks automatic) read +31 and
+55 µs a step alternating, +61 and -19 in random order: the coupling is within this host's
noise, but it is systematic where the noise is not.

A block is 32 steps (`--block-steps`), one epoch, about one batch of detection's notes
(`detect.batch.BATCH_CALLS`, ~12 notes a step here): a block ends with a settle (below), so a
shorter one settles more often than a run does. At 8 steps a block the figure was that of
96-note batches, whatever the batch size.

Figures (`name: value` lines):
- `auto_us_per_step`: median over rounds of (automatic − plain) µs a step, with the
  distribution-free 95 % interval (`_ci95_lo` / `_ci95_hi`); wall clock, so noisy on a busy host.
- `auto_cpu_us_per_step`: the same in the training thread's CPU time (`time.thread_time_ns`),
  which time spent waiting for a core on a loaded host does not inflate.
- `python_calls_per_step_plain` / `_auto` / `_added`: Python function calls a step
  (`sys.setprofile`, `otel_train.bench.device_path._count_calls`: no collection inside the
  window), over one epoch of steps each: independent of load.
- `c_calls_per_step_plain` / `_auto` / `_added`: the same for calls of C functions.
- with `--callgrind N` under `valgrind --tool=callgrind`: `instructions_per_step_plain` /
  `_auto` / `_added`, counted over `--rounds` rounds of a plain and an automatic block of N
  steps (alternating order), after one round run and thrown away (the first blocks run
  one-off work), each block between client requests (a tiny marker library built with the system C
  compiler from valgrind's `callgrind.h`), so the pauses' own work and the caches they cool
  are outside the counts. Take N = 32 (one epoch): each block then holds one new iterator of
  the loader, whose shuffle otherwise moves a block's count by ~200k a step. The dumps
  (`callgrind.out.PID.K`, one a block) are kept.
- the same with `--cache-sim=yes --branch-sim=yes --LL=<the host's L2: size,ways,line>` on
  valgrind's command line: `l1_misses_`, `ll_misses_`, `ll_instruction_misses_` and
  `branch_mispredicts_per_step_*` too. Instructions do not predict this loop's wall clock:
  its step touches more code and data than a core's L2 holds, so whatever automatic mode
  runs is cold every step, and each line it touches (and each line of torch's it displaces)
  costs a trip past L2. The misses, with L2 simulated as the last level, are the
  load-independent figure closest to the wall-clock cost
  (`docs/benchmarks/history.md`, 2026-11-26-auto-path-l2), but not for instruction fetches: cutting
  ~680 of those a step left the wall clock where it was, the prefetcher serving them
  (`docs/benchmarks/2026-11-27-optimizer-current-and-size.md`).
- with `--callgrind`, also where the added cost lies: `instructions_`, `ll_misses_` and
  `branch_mispredicts_per_step_added_<group>`, each block's functions' own costs summed by the
  object they lie in (`callgrind.OBJECT_GROUPS`: `otel_train`'s extensions, `python`, `torch`
  with MKL, `other`). Misses added in `torch` are torch's own lines that automatic mode
  displaced from L2.
- with `--per-call`: plain, automatic and automatic with each of detection's calls run at once
  (`benchmarks.switches.calls_at_once`: as before `detect/batch.py`, and as automatic mode runs
  wherever torch has an accelerator) in the same rounds, each round's three blocks in an order
  drawn at random: `auto_`, `per_call_` and `per_call_minus_auto_us_per_step`, and `records_per_step_auto` / `_per_call`: the spans each
  way exported over an epoch, a step (the same both ways), `train.other` apart
  (`other_per_step_auto` / `_per_call`: a step's gaps become spans until what stays uncovered
  is under `coverage.MAX_UNCOVERED`, so their number follows how long the gaps are, which
  per-call detection lengthens).
- with `--batch-calls N`: plain, automatic, and automatic with batches of N notes
  (`detect.batch.BATCH_CALLS` set to N inside its blocks) in the same rounds: `auto_`,
  `batch_calls_` and `batch_calls_minus_auto_us_per_step`; `batch_calls` is N and
  `batch_calls_auto` the shipped size. Blocks must hold a batch of both sizes for the
  difference to show (`--block-steps`).

Every timed or counted block ends with the detection calls it left waiting run
(`recorder.settle`), inside its time: before 2026-11-27 (afternoon) an 8-step block, ~88 notes,
fewer than a batch, left the replay of most of them to the untimed flush after the round, and
the batched figures left it out.
- with `--root-hooks`: plain, automatic, and automatic with the roots' forwards timed by hooks
  in their tables (`benchmarks.switches.root_hooks`, as once torch.compile may trace) rather than
  from their slots, in the same rounds: `auto_`, `root_hooks_` and
  `root_hooks_minus_auto_us_per_step` (what the slot saves: torch's dispatch for a module with
  hooks, `detect/torch_hooks.py`).
- with `--parts`: where automatic mode's cost lies, four variants in the same rounds: plain;
  `hooks`, automatic mode's hooks and patched functions calling stubs that only run the user's
  function (`benchmarks.switches.entry_points_stubbed`);
  `notes`, the calls noted as usual but never replayed (`benchmarks.switches.notes_dropped`:
  nothing recorded); and automatic. `hooks_`, `notes_`, `auto_us_per_step` against plain, and
  `notes_minus_hooks_` (making the notes) and `auto_minus_notes_us_per_step` (their replay and
  the records it makes).
- with `--floor`: the same figures, `floor` in their names where the others say `auto`, of
  `noop_hooks` against plain steps, no otel_train installed: the part of the cost any hook
  at those places pays.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import glob
import os
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from otel_train import semconv
from benchmarks import callgrind
from otel_train.bench.device_path import _count_calls
from otel_train.bench.harness import as_script, print_ci, print_figure
from otel_train.bench.stats import ci95_of

ACCUM = 2
BATCH = 64
SAMPLES = 4096  # 64 batches: one epoch is 32 steps


class AutoCostLoop:
    """The loop: `step()` runs one optimizer step of two micro-batches, a new iterator (epoch)
    whenever the loader runs out."""

    def __init__(self, seed: int = 0) -> None:
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                   nn.Linear(256, 10))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.loss = nn.CrossEntropyLoss()
        data = TensorDataset(torch.randn(SAMPLES, 64), torch.randint(0, 10, (SAMPLES,)))
        self.loader = DataLoader(data, batch_size=BATCH, shuffle=True)
        self.it = iter(self.loader)
        self.steps_per_epoch = SAMPLES // BATCH // ACCUM

    step: Callable[[AutoCostLoop], None]  # `_LOOP`, compiled as a script's code (below)


#: The loop's step, compiled outside otel_train's modules: detection reads a script's call sites
#: (where `zero_grad()` stands against the update, `detect/sites.py`) and skips frames of
#: otel_train's own modules, so a loop written in this module would take a path no user's does.
_LOOP = """
def step(self):
    for _ in range(ACCUM):
        try:
            x, y = next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            x, y = next(self.it)
        loss = self.loss(self.model(x), y) / ACCUM
        loss.backward()
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
"""
AutoCostLoop.step = as_script(_LOOP, "auto_cost_loop", ACCUM=ACCUM)["step"]  # type: ignore[method-assign]


def round_orders(rounds: int, names: tuple[str, ...] = ("plain", "auto"), seed: int = 0) -> list[tuple[str, ...]]:
    """The order of the variants' blocks in each round: drawn at random, so that no period of
    the loop (an epoch's first step, which falls in every other round) lines up with one variant."""
    rng = random.Random(seed)
    return [tuple(rng.sample(names, len(names))) for _ in range(rounds)]


def _timed(step: Callable[[], None], steps: int) -> tuple[int, int]:
    """(wall ns, this thread's CPU ns) of `steps` steps, with the detection calls they left
    waiting run inside that time (`recorder.settle`): a block shorter than a batch of notes
    would otherwise leave its replay to the untimed flush after the round."""
    from otel_train.record import recorder

    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(steps):
        step()
    recorder.settle()
    return time.perf_counter_ns() - t0, time.thread_time_ns() - c0


def _timed_rounds(loop: AutoCostLoop, variants: dict[str, Callable[[], Any]], rounds: int, block_steps: int,
                  between: Callable[[], Any], after: Callable[[], None]) -> dict[str, list[tuple[int, int]]]:
    """Each round one block of each variant (`variants[name]()` around it, outside its time), in
    an order drawn at random, inside `between()` and followed by `after()`: each variant's
    (wall ns, CPU ns) a block, round by round."""
    timed: dict[str, list[tuple[int, int]]] = {name: [] for name in variants}
    for order in round_orders(rounds, tuple(variants)):
        with between():
            for name in order:
                with variants[name]():
                    timed[name].append(_timed(loop.step, block_steps))
        after()
    return timed


_MARKER_C = """
#include <valgrind/callgrind.h>
void otel_train_bench_zero(void) { CALLGRIND_ZERO_STATS; }
void otel_train_bench_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
int otel_train_bench_on_valgrind(void) { return RUNNING_ON_VALGRIND; }
"""


def _marker_lib(tmp: str) -> Any:
    src, lib = os.path.join(tmp, "marker.c"), os.path.join(tmp, "marker.so")
    with open(src, "w") as f:
        f.write(_MARKER_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", lib, src], check=True)
    return ctypes.CDLL(lib)


def _callgrind(loop: AutoCostLoop, steps: int, rounds: int, plain: Callable[[], Any],
               variant: Callable[[], Any]) -> dict[str, dict[str, Any]]:
    """Events a step of each kind ("plain", "variant"): `rounds` rounds of a `plain()` and a
    `variant()` block of `steps` steps, in alternating order, each block counted between a zero
    and a dump, after one round run the same way and thrown away (the first blocks run one-off
    work, and a process's first dump gives its functions costs from before its zero). Each
    kind's `{"all": {event: n}, "groups": {group: {event: n}}}` (`callgrind.events_by_group`).
    The dumps are read after the last block: reading one is ~100M instructions, which between
    blocks moved the next block's per-function costs (though not its summary)."""
    from otel_train.record import recorder

    with tempfile.TemporaryDirectory() as tmp:
        marker = _marker_lib(tmp)
        if not marker.otel_train_bench_on_valgrind():
            raise SystemExit("python -m benchmarks.auto_cost --callgrind: run it under valgrind --tool=callgrind "
                             "(the interpreter itself, not a shim script: valgrind does not follow children)")
        dumps: list[tuple[str, str]] = []
        for r in range(-1, rounds):  # round -1: thrown away
            for kind in ("plain", "variant") if r % 2 == 0 else ("variant", "plain"):
                before = set(glob.glob(f"callgrind.out.{os.getpid()}*"))
                with plain() if kind == "plain" else variant():
                    marker.otel_train_bench_zero()
                    for _ in range(steps):
                        loop.step()
                    recorder.settle()  # the block's waiting calls in its count (`_timed`)
                    marker.otel_train_bench_dump(kind.encode())
                dump = callgrind.newest_dump(before)
                if r < 0:
                    os.remove(dump)
                else:
                    dumps.append((kind, dump))
    totals: dict[str, dict[str, int]] = {"plain": {}, "variant": {}}
    groups: dict[str, dict[str, dict[str, int]]] = {"plain": {}, "variant": {}}
    for kind, dump in dumps:
        for event, n in callgrind.events(dump).items():
            totals[kind][event] = totals[kind].get(event, 0) + n
        for group, counted in callgrind.events_by_group(dump).items():
            into = groups[kind].setdefault(group, {})
            for event, n in counted.items():
                into[event] = into.get(event, 0) + n
    blocks = steps * rounds
    return {kind: {"all": {e: n / blocks for e, n in totals[kind].items()},
                   "groups": {g: {e: n / blocks for e, n in by.items()} for g, by in groups[kind].items()}}
            for kind in totals}


@contextlib.contextmanager
def noop_hooks(loop: AutoCostLoop) -> Iterator[None]:
    """`--floor`'s variant: a no-op hook or wrapper at each place automatic mode hooks into this
    loop (the root module's forward pre-hook and always-called forward hook, the global
    optimizer step pre/post hooks, and Python wrappers of `torch.autograd.backward`, the
    `DataLoader` iterator's `__next__` and `Optimizer.zero_grad`), with no otel_train: what
    hooking in costs before anything is done there."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from torch.utils.data import dataloader

    def wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **kwargs)
        return wrapped

    handles = [loop.model.register_forward_pre_hook(lambda module, args: None),
               loop.model.register_forward_hook(lambda module, args, out: None, always_call=True),
               register_optimizer_step_pre_hook(lambda opt, args, kwargs: None),
               register_optimizer_step_post_hook(lambda opt, args, kwargs: None)]
    owners = [(torch.autograd, "backward"), (dataloader._BaseDataLoaderIter, "__next__"),
              (torch.optim.Optimizer, "zero_grad")]
    originals = [vars(owner)[name] for owner, name in owners]
    for (owner, name), original in zip(owners, originals):
        setattr(owner, name, wrapper(original))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for (owner, name), original in zip(owners, originals):
            setattr(owner, name, original)


def run_auto_cost(rounds: int = 20, block_steps: int = 32, callgrind_steps: int = 0, floor: bool = False,
                  per_call: bool = False, parts: bool = False, batch_calls: int = 0, root_hooks: bool = False) -> int:
    """Automatic mode against plain steps; with `floor`, `noop_hooks` against plain steps (no
    otel_train installed), `floor` in its figures' names where automatic mode's say `auto`;
    with `per_call`, plain, automatic and automatic with each call run at once
    (`_measure_per_call`); with `parts`, plain, the hooks alone, the notes alone and automatic
    (`_measure_parts`); with `batch_calls`, plain, automatic and automatic with batches of that
    many notes (`_measure_batch_calls`); with `root_hooks`, plain, automatic and automatic with
    the roots timed by hooks (`_measure_root_hooks`)."""
    import torch

    torch.set_num_threads(1)
    loop = AutoCostLoop()
    for _ in range(5):
        loop.step()
    if floor:
        _measure(loop, "floor", rounds, block_steps, callgrind_steps, plain=contextlib.nullcontext,
                 variant=lambda: noop_hooks(loop), between=contextlib.nullcontext, after=lambda: None)
        return 0

    import otel_train
    from otel_train import _runtime
    from otel_train.instrumentation import TorchTrainingInstrumentor
    from otel_train.bench.switches import held, paused_detection

    out_dir = tempfile.mkdtemp(prefix="otel-train-auto-cost-")
    otel_train.init(run_id=f"auto-cost-{os.getpid()}", output_dir=out_dir, metric_interval_ms=60000)
    worker = _runtime.state().worker  # type: ignore[union-attr]
    instrumentor = TorchTrainingInstrumentor()
    instrumentor.instrument()
    try:
        for _ in range(6):  # discovery, then the settle onto the root modules
            loop.step()
        worker.flush()
        if per_call:
            _measure_per_call(loop, rounds, block_steps, plain=paused_detection, between=lambda: held(worker),
                              after=worker.flush, exported=functools.partial(_span_names, out_dir))
            return 0
        if parts:
            _measure_parts(loop, rounds, block_steps, plain=paused_detection, between=lambda: held(worker),
                           after=worker.flush)
            return 0
        if batch_calls:
            _measure_batch_calls(loop, rounds, block_steps, batch_calls, plain=paused_detection,
                                 between=lambda: held(worker), after=worker.flush)
            return 0
        if root_hooks:
            _measure_root_hooks(loop, rounds, block_steps, plain=paused_detection, between=lambda: held(worker),
                                after=worker.flush)
            return 0
        _measure(loop, "auto", rounds, block_steps, callgrind_steps, plain=paused_detection,
                 variant=contextlib.nullcontext, between=lambda: held(worker), after=worker.flush)
    finally:
        instrumentor.uninstrument()
        otel_train.shutdown()
    return 0


def _measure(loop: AutoCostLoop, label: str, rounds: int, block_steps: int, callgrind_steps: int,
             plain: Callable[[], Any], variant: Callable[[], Any], between: Callable[[], Any],
             after: Callable[[], None]) -> None:
    """Print the figures of `variant()` blocks (named by `label`) against `plain()` ones, each
    round inside `between()` and followed by `after()` (automatic mode: the worker held, then
    flushed)."""
    import torch

    print_figure("torch_threads", torch.get_num_threads())
    print_figure("load_avg_1m", os.getloadavg()[0])
    if callgrind_steps:
        with between():
            counted = _callgrind(loop, callgrind_steps, rounds, plain, variant)
        print_figure("callgrind_steps", callgrind_steps)
        print_figure("callgrind_rounds", rounds)
        named = {"plain": counted["plain"], label: counted["variant"]}
        for name, value in callgrind.figures({k: v["all"] for k, v in named.items()}, label).items():
            print_figure(name, value)
        for name, value in callgrind.added_by_group({k: v["groups"] for k, v in named.items()}, label).items():
            print_figure(name, value)
        return
    epoch = loop.steps_per_epoch
    with between():
        with plain():
            plain_calls = _count_calls(loop.step, epoch)
        with variant():
            variant_calls = _count_calls(loop.step, epoch)
    after()
    for i, name in enumerate(("python", "c")):
        print_figure(f"{name}_calls_per_step_plain", plain_calls[i] / epoch)
        print_figure(f"{name}_calls_per_step_{label}", variant_calls[i] / epoch)
        print_figure(f"{name}_calls_per_step_added", (variant_calls[i] - plain_calls[i]) / epoch)
    timed = _timed_rounds(loop, {"plain": plain, label: variant}, rounds, block_steps, between, after)
    plain_us = [wall / block_steps / 1e3 for wall, _ in timed["plain"]]
    added_us = [(v[0] - p[0]) / block_steps / 1e3 for v, p in zip(timed[label], timed["plain"])]
    added_cpu_us = [(v[1] - p[1]) / block_steps / 1e3 for v, p in zip(timed[label], timed["plain"])]
    print_figure("rounds", rounds)
    print_figure("block_steps", block_steps)
    print_figure("step_us_plain", statistics.median(plain_us))
    print_figure(f"{label}_us_per_step", statistics.median(added_us))
    print_ci(f"{label}_us_per_step", ci95_of(added_us))
    print_figure(f"{label}_pct_per_step", 100 * statistics.median(added_us) / statistics.median(plain_us))
    print_figure(f"{label}_cpu_us_per_step", statistics.median(added_cpu_us))
    print_ci(f"{label}_cpu_us_per_step", ci95_of(added_cpu_us))


def _span_names(out_dir: str) -> collections.Counter[str]:
    """The spans written to `out_dir` so far, by name."""
    from otel_train.analyze import reader

    try:
        sources = reader.find_sources(out_dir)
    except reader.InputError:  # nothing written yet
        return collections.Counter()
    return collections.Counter(span.name for span in reader.iter_spans(sources))


def _measure_per_call(loop: AutoCostLoop, rounds: int, block_steps: int, plain: Callable[[], Any],
                      between: Callable[[], Any], after: Callable[[], None],
                      exported: Callable[[], collections.Counter[str]]) -> None:
    """`--per-call`: plain, automatic and per-call automatic blocks, each round's three in an order
    drawn at random (seeded), as `_measure` times its two.
    First one epoch each way, untimed, for the spans each makes (`exported()`: those written so
    far, by name). An epoch's count holds the step before it and not its own last, which the
    next step closes: one step record each way."""
    from otel_train.record import recorder
    from benchmarks.switches import calls_at_once

    epoch = loop.steps_per_epoch
    made: dict[str, collections.Counter[str]] = {}
    for name, block in (("auto", contextlib.nullcontext), ("per_call", calls_at_once)):
        before = exported()
        with between(), block():
            for _ in range(epoch):
                loop.step()
            recorder.settle()
        after()
        made[name] = exported() - before
    for name, spans in made.items():
        other = spans.pop(semconv.SPAN_OTHER, 0)
        print_figure(f"records_per_step_{name}", sum(spans.values()) / epoch)
        print_figure(f"other_per_step_{name}", other / epoch)
    variants = {"plain": plain, "auto": contextlib.nullcontext, "per_call": calls_at_once}
    _print_variants(_timed_rounds(loop, variants, rounds, block_steps, between, after), rounds, block_steps,
                    (("auto", "plain"), ("per_call", "plain"), ("per_call", "auto")))


def _measure_parts(loop: AutoCostLoop, rounds: int, block_steps: int, plain: Callable[[], Any],
                   between: Callable[[], Any], after: Callable[[], None]) -> None:
    """`--parts`: plain, the hooks alone, the notes alone and automatic blocks, each round's four
    in an order drawn at random (seeded), as `_measure` times its two."""
    from benchmarks.switches import entry_points_stubbed, notes_dropped

    variants = {"plain": plain, "hooks": entry_points_stubbed, "notes": notes_dropped,
                "auto": contextlib.nullcontext}
    _print_variants(_timed_rounds(loop, variants, rounds, block_steps, between, after), rounds, block_steps,
                    (("hooks", "plain"), ("notes", "plain"), ("auto", "plain"), ("notes", "hooks"),
                     ("auto", "notes")))


@contextlib.contextmanager
def batches_of(calls: int) -> Iterator[None]:
    """Batches of `calls` detection notes inside the block (`detect.batch.BATCH_CALLS`, read as
    each batch begins), the shipped size after it."""
    from otel_train.detect import batch

    shipped, batch.BATCH_CALLS = batch.BATCH_CALLS, calls
    try:
        yield
    finally:
        batch.BATCH_CALLS = shipped


def _measure_batch_calls(loop: AutoCostLoop, rounds: int, block_steps: int, calls: int, plain: Callable[[], Any],
                         between: Callable[[], Any], after: Callable[[], None]) -> None:
    """`--batch-calls N`: plain, automatic and automatic with batches of `calls` notes, each
    round's three blocks in an order drawn at random (seeded), as `_measure` times its two."""
    from otel_train.detect import batch

    print_figure("batch_calls", calls)
    print_figure("batch_calls_auto", batch.BATCH_CALLS)
    variants = {"plain": plain, "auto": contextlib.nullcontext, "batch_calls": functools.partial(batches_of, calls)}
    _print_variants(_timed_rounds(loop, variants, rounds, block_steps, between, after), rounds, block_steps,
                    (("auto", "plain"), ("batch_calls", "plain"), ("batch_calls", "auto")))


def _measure_root_hooks(loop: AutoCostLoop, rounds: int, block_steps: int, plain: Callable[[], Any],
                        between: Callable[[], Any], after: Callable[[], None]) -> None:
    """`--root-hooks`: plain, automatic and automatic with the roots timed by hooks, each round's
    three blocks in an order drawn at random (seeded), as `_measure` times its two."""
    from benchmarks.switches import root_hooks

    variants = {"plain": plain, "auto": contextlib.nullcontext, "root_hooks": root_hooks}
    _print_variants(_timed_rounds(loop, variants, rounds, block_steps, between, after), rounds, block_steps,
                    (("auto", "plain"), ("root_hooks", "plain"), ("root_hooks", "auto")))


def _print_variants(timed: dict[str, list[tuple[int, int]]], rounds: int, block_steps: int,
                    pairs: tuple[tuple[str, str], ...]) -> None:
    """The figures of `_timed_rounds`' blocks: µs a step each `(name, base)` pair adds, named
    `name_us_per_step` against plain and `name_minus_base_us_per_step` otherwise."""
    def added(name: str, base: str) -> list[float]:
        return [(v[0] - b[0]) / block_steps / 1e3 for v, b in zip(timed[name], timed[base])]

    print_figure("rounds", rounds)
    print_figure("block_steps", block_steps)
    print_figure("step_us_plain", statistics.median(w / block_steps / 1e3 for w, _ in timed["plain"]))
    for name, base in pairs:
        values = added(name, base)
        label = name if base == "plain" else f"{name}_minus_{base}"
        print_figure(f"{label}_us_per_step", statistics.median(values))
        print_ci(f"{label}_us_per_step", ci95_of(values))


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.auto_cost [--rounds N] [--block-steps N] [one variant flag]`."""
    import argparse

    auto = argparse.ArgumentParser(prog="python -m benchmarks.auto_cost",
                                   description="automatic instrumentation's own cost a step on a small CPU loop: "
                                               "µs (plain vs automatic, interleaved), Python calls, instructions")
    auto.add_argument("--rounds", type=int, default=40, help="rounds of a plain and an automatic block (default 40)")
    auto.add_argument("--block-steps", type=int, default=32,
                      help="steps per timed block (default 32: an epoch, about one batch of detection's notes)")
    auto.add_argument("--callgrind", type=int, default=0, metavar="N",
                      help="under valgrind --tool=callgrind: count instructions (and, with its --cache-sim "
                           "and --branch-sim, misses) over N plain and N automatic steps instead of timing")
    auto.add_argument("--floor", action="store_true",
                      help="no-op hooks at the places automatic mode hooks in (no otel_train) against plain "
                           "steps: what hooking in costs before anything is done there")
    auto.add_argument("--per-call", action="store_true",
                      help="also time automatic mode with each of detection's calls run at once (no batching), "
                           "in the same rounds")
    auto.add_argument("--parts", action="store_true",
                      help="where automatic mode's cost lies: its hooks alone (stub entry points), its calls "
                           "noted but not replayed, and all of it, against plain steps in the same rounds")
    auto.add_argument("--batch-calls", type=int, default=0, metavar="N",
                      help="also time automatic mode with batches of N detection notes (the shipped size: "
                           "detect.batch.BATCH_CALLS) in the same rounds")
    auto.add_argument("--root-hooks", action="store_true",
                      help="also time automatic mode with the root modules' forwards timed by hooks (as once "
                           "torch.compile may trace) rather than from their slots, in the same rounds")
    args = auto.parse_args(argv)
    if args.rounds < 3 or args.block_steps < 1 or args.callgrind < 0:
        auto.error("--rounds must be >= 3, --block-steps >= 1 and --callgrind >= 0")
    if args.batch_calls:
        from otel_train.detect.batch import SMALL_BATCH  # imports torch, which the bench runs anyway

        if args.batch_calls < SMALL_BATCH:
            auto.error(f"--batch-calls must be at least {SMALL_BATCH}: smaller batches turn batching off "
                       "for the rest of the run (detect.batch.SMALL_BATCH)")
    given = [flag for flag, on in (("--per-call", args.per_call), ("--parts", args.parts),
                                   ("--batch-calls", args.batch_calls), ("--root-hooks", args.root_hooks),
                                   ("--callgrind", args.callgrind), ("--floor", args.floor)) if on]
    if len(given) > 1 and (args.per_call or args.parts or args.batch_calls or args.root_hooks):
        auto.error(f"{' with '.join(given)}: --per-call, --parts, --batch-calls and --root-hooks each time "
                   "their own variants, alone (not with --callgrind, --floor or each other)")
    return run_auto_cost(rounds=args.rounds, block_steps=args.block_steps, callgrind_steps=args.callgrind,
                         floor=args.floor, per_call=args.per_call, parts=args.parts,
                         batch_calls=args.batch_calls, root_hooks=args.root_hooks)


if __name__ == "__main__":
    raise SystemExit(main())
