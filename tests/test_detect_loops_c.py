"""The step machine's per-step loops in C (`otel_train/detect/_loops.c`) against the Python
loops they replace: the same records in the same order, the same uncovered time, the same
sizes and sources, on random inputs."""

from __future__ import annotations

import contextlib
import itertools
import random
import sys

import pytest

from otel_train import semconv
from otel_train.detect import coverage, machine

_loops = pytest.importorskip("otel_train.detect._loops")

KIND, OTHER, DATA, ZERO_GRAD = 0, semconv.SPAN_OTHER, semconv.SPAN_DATA, semconv.SPAN_ZERO_GRAD
REF = (7, 41)


def _records(r, first: int) -> list:
    """A recorder's records, comparable across runs: span numbers made relative to `first`, a
    step's number (the process's) left out."""
    return [(rec[1], rec[2] - first, rec[3] is not None, rec[4][1] is not None, rec[5], rec[6], rec[7])
            if rec[0] == KIND else ("step", rec[5], rec[6], rec[7]) for rec in (r.buf if r is not None else ())]


def _gaps(fn, cover: list[int], t0: int, t1: int, share: float = coverage.MAX_UNCOVERED,
          min_gap: int = coverage.MIN_GAP_NS) -> tuple[int, list]:
    out: list = []
    total = fn(list(cover), t0, t1, share, min_gap, out.append, itertools.count(100), KIND, OTHER, REF)
    return total, out


def _random_cover(rng: random.Random, t0: int, t1: int, n: int) -> list[int]:
    cover: list[int] = []
    for _ in range(n):
        a = rng.randint(t0 - 50_000, t1 + 50_000)  # some start before the step or end after it
        cover += (a, a + rng.choice([0, 1, 999, 1_000, rng.randint(0, 400_000)]))
    if rng.random() < 0.5:  # in recording order, mostly sorted
        pairs = sorted(zip(cover[::2], cover[1::2]))
        cover = [x for pair in pairs for x in pair]
    return cover


def test_gaps_match_the_python_loop_on_random_steps() -> None:
    rng = random.Random(31)
    for trial in range(3_000):
        t0 = rng.randint(0, 10**12)
        t1 = t0 + rng.choice([0, 500, rng.randint(1, 3_000_000)])
        n = rng.choice([0, 1, 2, 7, 12, rng.randint(0, 80)])  # over 32: the heap buffers
        cover = _random_cover(rng, t0, t1, n)
        share = rng.choice([coverage.MAX_UNCOVERED, 0.0, 0.2, 1.0])
        expected = _gaps(coverage.gaps_python, cover, t0, t1, share)
        assert _gaps(_loops.gaps, cover, t0, t1, share) == expected, (trial, cover, t0, t1, share)


def test_gaps_of_a_usual_step() -> None:
    """Data, forward, backward and update with the loss and host code between: the largest gaps
    become train.other until at most 0.5 % stays uncovered; a gap under MIN_GAP_NS never does."""
    t0, t1 = 1_000_000, 2_000_000  # 0.5 %: 5,000 ns may stay uncovered
    cover = [1_000_000, 1_100_000, 1_150_000, 1_500_000, 1_506_000, 1_900_000, 1_900_500, 1_990_000]
    total, out = _gaps(_loops.gaps, cover, t0, t1)
    assert [(r[1], r[2], r[4], r[5], r[6]) for r in out] == [
        (OTHER, 100, REF, 1_100_000, 1_150_000), (OTHER, 101, REF, 1_990_000, 2_000_000),
        (OTHER, 102, REF, 1_500_000, 1_506_000)]
    assert total == 500  # the 500 ns between backward and update
    total, out = _gaps(_loops.gaps, [100, 900, 1_700, 99_300], 0, 100_000)  # 500 ns may stay
    assert (total, out) == (100 + 800 + 700, [])  # over the bound, but each gap under MIN_GAP_NS


def test_resolve_matches_the_python_loop_on_random_pendings() -> None:
    rng = random.Random(26)
    sources = [object() for _ in range(4)]
    attrs = {"train.micro_batch": 1}
    for trial in range(2_000):
        pending = []
        for i in range(rng.choice([0, 1, 2, 5])):
            name = rng.choice([DATA, DATA, ZERO_GRAD])
            src = rng.choice(sources + [None]) if name is DATA else None
            size = rng.choice([None, (rng.randint(1, 64), 0), (rng.randint(1, 64), rng.randint(1, 9_000)),
                               (rng.randint(1, 64), None)]) if name is DATA else None
            pending.append([name, 10 * i, 10 * i + 5, src, None, size])
        train_src = rng.choice(sources + [None])
        parent = rng.choice([None, 12])
        covered = rng.random() < 0.7
        results = []
        for fn in (machine.resolve_python, _loops.resolve):
            out: list = []
            cover = [1, 2] if covered else None
            got = fn([list(e) for e in pending], DATA, attrs, parent, REF, itertools.count(5), out.append, KIND,
                     cover, train_src)
            results.append((got, out, cover))
        assert results[0] == results[1], (trial, pending)


def test_resolve_records_carry_the_data_attributes_on_fetches_only() -> None:
    src = object()
    attrs = {"train.micro_batch": 0}
    out: list = []
    cover: list[int] = []
    got = _loops.resolve([[DATA, 1, 2, src, None, (32, 0)], [ZERO_GRAD, 3, 4, None, None, None],
                            [DATA, 5, 6, src, None, (32, 512)]], DATA, attrs, None, REF, itertools.count(9),
                           out.append, KIND, cover, None)
    assert got == (src, False, 64, 512, True)
    assert out == [(KIND, DATA, 9, None, REF, 1, 2, attrs, None, None),
                   (KIND, ZERO_GRAD, 10, None, REF, 3, 4, None, None, None),
                   (KIND, DATA, 11, None, REF, 5, 6, attrs, None, None)]
    assert cover == [1, 2, 3, 4, 5, 6]


def test_bad_arguments_raise_instead_of_crashing() -> None:
    count = itertools.count()
    with pytest.raises(TypeError):
        _loops.gaps([1, 2, 3], 0, 10, 0.0, 1, [].append, count, KIND, OTHER, REF)  # odd bounds
    with pytest.raises(TypeError):
        _loops.gaps((1, 2), 0, 10, 0.0, 1, [].append, count, KIND, OTHER, REF)
    with pytest.raises(TypeError):
        _loops.gaps([1, "x"], 0, 10, 0.0, 1, [].append, count, KIND, OTHER, REF)
    with pytest.raises(TypeError):
        _loops.gaps([], 0, 10)
    with pytest.raises(OverflowError):  # no time is that late: said, not wrapped round
        _loops.gaps([0, 2**70], 0, 10, 0.0, 1, [].append, count, KIND, OTHER, REF)
    with pytest.raises(RuntimeError):  # the span numbers ran out
        _loops.gaps([], 0, 10_000, 0.0, 1, [].append, iter(()), KIND, OTHER, REF)
    with pytest.raises(TypeError):
        _loops.resolve([(DATA, 1, 2, None, None, None)], DATA, {}, None, REF, count, [].append, KIND, None, None)
    with pytest.raises(TypeError):
        _loops.resolve([[DATA, 1, 2, None, None, (1, 2, 3)]], DATA, {}, None, REF, count, [].append, KIND,
                         None, None)
    with pytest.raises(TypeError):
        _loops.part_begin(None)
    with pytest.raises(TypeError):
        _loops.phase_end(None, None, None)
    with pytest.raises(TypeError):  # args not a tuple
        _loops.zero_grad_run(None, None, print, [1], {})
    with pytest.raises(TypeError):
        _loops.optimizer_begin(None, ())
    with pytest.raises(ZeroDivisionError):  # an append that raises: its error, nothing swallowed
        _loops.resolve([[DATA, 1, 2, None, None, None]], DATA, {}, None, REF, count, lambda r: 1 / 0, KIND,
                         None, None)


def test_no_leak() -> None:
    src = object()
    size = (3, 4)
    before = sys.getrefcount(src), sys.getrefcount(size)
    for _ in range(1_000):
        _loops.resolve([[DATA, 1, 2, src, None, size]], DATA, {}, None, REF, itertools.count(), [].append,
                         KIND, [], src)
        _loops.gaps(list(range(100)), 0, 200, 0.0, 1, [].append, itertools.count(), KIND, OTHER, REF)
    assert (sys.getrefcount(src), sys.getrefcount(size)) == before


def _chain(names: list[str]):
    """Functions calling each other, outermost first, each with its module's `__name__`; the
    innermost calls both walks and returns what they give."""
    from otel_train.detect import sites

    scope = {"__name__": "otel_train.detect.sites", "sites": sites, "_loops": _loops}
    exec("def innermost(limit):\n    return sites.user_frames_python(limit), _loops.user_frames(limit)\n", scope)
    call = scope["innermost"]
    for i, name in enumerate(reversed(names)):
        scope = {"__name__": name, "inner": call}
        exec(f"def f{i}(limit):\n    return inner(limit)\n", scope)
        call = scope[f"f{i}"]
    return call


@pytest.mark.parametrize("names", [
    ["script", "torch.optim.optimizer", "otel_train.detect.optimizer"],
    ["script", "accelerate.optimizer", "torch", "torch.optim.optimizer", "otel_train.detect.optimizer"],
    ["script"] + ["torch.nn.modules.module"] * 20,  # the user's frame beyond the walk's depth
    ["a", "b", "c", "d", "torch.x"],
    ["torchvision.models", "otel_trainer.x", "torch_geometric.y"],  # near misses are the user's
])
@pytest.mark.parametrize("limit", [1, 3])
def test_user_frames_match_the_python_walk(names: list[str], limit: int) -> None:
    from otel_train.detect import sites
    _loops.bind(sites._OURS, sites._MAX_DEPTH)
    python, c = _chain(names)(limit)
    assert c == python
    want = expected(names, limit)
    assert [f.f_globals["__name__"] for f in c][:len(want)] == want  # then this test's callers, if room


def expected(names: list[str], limit: int) -> list[str]:
    """The walk written out on the names: innermost first, `_MAX_DEPTH` frames looked at
    (the innermost, ours, is the first), torch's and ours skipped, at most `limit`."""
    from otel_train.detect import sites
    looked = ["otel_train.detect.sites"] + names[::-1]
    users = [n for n in looked[:sites._MAX_DEPTH] if not (n.startswith(("torch.", "otel_train.")) or n == "torch")]
    return users[:limit]


def _pending_state(rng: random.Random, sources: list, r, fn) -> tuple:
    """One random moment before a training phase: fetches (and a zero_grad) pending, our step
    open or not, a region open or not; `fn` resolves it. Returns what it changed."""
    from otel_train.detect.state import State
    from otel_train.record import recorder as _recorder
    s = State()
    s.mb = rng.choice([0, 1, 300])  # 300: past the shared attribute dicts
    s.train_src = rng.choice(sources + [None])
    s.data_driven = rng.choice([None, True, False])
    for i in range(rng.choice([0, 1, 2, 4])):
        if rng.random() < 0.2:
            s.pending.append([ZERO_GRAD, 10 * i, 10 * i + 3, None, None, None])
        else:
            s.pending.append([DATA, 10 * i, 10 * i + 5, rng.choice(sources + [None]), None,
                              rng.choice([None, (8, 0), (8, 128), (4, None)])])
    step = None
    if rng.random() < 0.8:
        step = _recorder.Step(None, None, None)
        step.__enter__()
        if rng.random() < 0.5:
            step.attrs = {"train.samples": 2}
        if rng.random() < 0.9:
            s.step = step  # ours (else the user's own step)
    region = _recorder.Region("user.region").__enter__() if rng.random() < 0.3 else None
    first = next(_recorder.seq)
    fn(r, s)
    records = [(rec[1], rec[2] - first, rec[3] is not None, rec[4][1] is not None, rec[5], rec[6], rec[7])
               for rec in r.buf if rec[1] in (DATA, ZERO_GRAD)]
    r.buf.clear()
    if region is not None:
        region.__exit__(None, None, None)
    attrs = dict(step.attrs) if step is not None and step.attrs is not None else None
    if step is not None:
        _recorder.close_step(r, step, 1_000, None)
    out = (records, list(s.cover), attrs, s.pending, s.data_driven, sources.index(s.train_src) if s.train_src in sources else s.train_src)
    r.buf.clear()
    return out


def test_resolve_pending_matches_the_python_function() -> None:
    """On a real recorder and detection state: the same records (numbers, parents, steps,
    attributes), the same coverage, step sizes, loader and data-driven flag."""
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import FakeClock
    r = _recorder.Recorder(4096, FakeClock())
    _recorder.install(r)
    try:
        sources = [object() for _ in range(3)]
        seen = set()
        for trial in range(400):
            got = [_pending_state(random.Random(trial), sources, r, fn)
                   for fn in (machine.resolve_pending_python, _loops.resolve_pending)]
            assert got[0] == got[1], trial
            records, cover, attrs, pending, _, _ = got[0]
            assert pending == []  # nothing left pending
            seen.update({"records"} if records else set(), {"cover"} if cover else set(),
                        {"tokens"} if attrs and "train.tokens" in attrs else set(),
                        {"parent"} if any(rec[2] for rec in records) else set())
        assert seen == {"records", "cover", "tokens", "parent"}  # every branch taken
    finally:
        _recorder.install(None)


def _other_state():
    from otel_train.detect.state import State

    class OtherState(State):
        """Not `State` itself: the C functions read its fields by name, not where they lie."""
    return OtherState


OtherState = _other_state()


@contextlib.contextmanager
def _all_python():
    """The Python reference all the way down: what a Python function calls of the step machine
    is the Python version too (`machine.close` is C where built)."""
    close = machine.close
    machine.close = machine.close_python
    try:
        yield
    finally:
        machine.close = close


def _close_moment(seed: int, fn) -> tuple:
    """A random step close on a fresh recorder: our step open or not, the update's phase open
    or not, phases covering some of it, a boundary and siblings before. Returns what changed."""
    from otel_train.detect import phase
    from otel_train.detect.state import State
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import FakeClock
    rng = random.Random(seed)
    clock = FakeClock()
    r = _recorder.Recorder(4096, clock)
    _recorder.install(r)
    try:
        s = State()
        s.boundary = rng.choice([None, 5, 10**9])
        s.after = rng.choice([None, 7, 10**9])
        clock.advance(1_000)
        if rng.random() < 0.8:
            s.step = _recorder.Step(None, None, rng.choice([None, {"train.samples": 3}])).__enter__()
            s.step.t0 = 1_000 - rng.choice([0, 500])
            for _ in range(rng.choice([0, 1, 3])):
                a = clock.perf_ns() + rng.randint(0, 50_000)
                s.cover += (a, a + rng.randint(0, 100_000))
            if rng.random() < 0.3:  # closed by another step of the user's: not ours to close
                s.step = _recorder.Step(None, None, None)
        if rng.random() < 0.3:
            phase.part_begin(s, phase.STEP)
            clock.advance(2_000)
            phase.part_end(r, s)
        s.opt_end = rng.choice([None, clock.perf_ns()])
        clock.advance(200_000)
        first = next(_recorder.seq)
        fn(r, s, rng.choice([clock.perf_ns(), 900, 1_500]))
        records = _records(r, first)
        return (s.step, s.opt_end, s.boundary, s.after, s.cover, s.phase is None, records)
    finally:
        _recorder.install(None)


def test_close_matches_the_python_function() -> None:
    """A step closing in C against the Python function (its phase ended, its gaps as
    train.other, its record, the boundary and the between-steps cursor moved), on random steps."""
    recorded = 0
    for seed in range(500):
        python = _close_moment(seed, machine.close_python)
        c = _close_moment(seed, _loops.close)
        assert c == python, seed
        recorded += any(rec[0] == "step" for rec in python[-1])
    assert recorded > 100


def _activity(seed: int, fn, state_cls=None) -> tuple:
    """A random moment of the step machine on a fresh recorder; `fn` is told a training phase
    begins. Returns what it gave and changed, the span numbers made relative."""
    from otel_train.detect import phase
    from otel_train.detect.state import PH_BWD, PH_FWD, PH_OPT, State
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import FakeClock
    rng = random.Random(seed)
    clock = FakeClock()
    r = _recorder.Recorder(4096, clock)
    _recorder.install(r)
    try:
        s = (state_cls or State)()
        sources = [object(), object()]
        s.mb = rng.choice([0, 1, 2])
        s.mb_fwd, s.mb_bwd = rng.random() < 0.5, rng.random() < 0.5
        s.opt_end = rng.choice([None, None, 5])
        s.data_driven = rng.choice([None, True, False])
        s.uses_opt = rng.choice([True, True, False, None])
        s.train_src = rng.choice(sources + [None])
        for i in range(rng.choice([0, 0, 1, 2])):
            s.pending.append([DATA, 10 + i, 12 + i, rng.choice(sources), None, rng.choice([None, (4, 0)])])
        user_step = None
        roll = rng.random()
        if roll < 0.7:  # ours
            s.step = _recorder.Step(None, None, None).__enter__()
        elif roll < 0.85:  # the user's own step
            user_step = _recorder.Step(None, None, None).__enter__()
        if rng.random() < 0.15:  # the update's phase still open
            phase.part_begin(s, phase.STEP)
            clock.advance(3)
            phase.part_end(r, s)
        if rng.random() < 0.15:  # an evaluation pass in progress
            s.eval_t0, s.eval_t1, s.eval_explicit = 20, 25, rng.random() < 0.5
        before_step = s.step
        first = next(_recorder.seq)
        clock.advance(100)
        kind = rng.choice([PH_FWD, PH_BWD, PH_OPT])
        got = fn(r, s, clock.perf_ns(), kind)
        which = ("none" if got is None else "ours" if got is before_step else "user" if got is user_step
                 else "new" if got is s.step else "other")
        records = _records(r, first)
        pending = [[e[0], e[1], e[2], sources.index(e[3]), e[4], e[5]] for e in s.pending]
        return (which, s.mb, s.mb_fwd, s.mb_bwd, s.step is before_step, s.opt_end, pending, s.cover,
                s.data_driven, s.train_src in sources and sources.index(s.train_src), s.uses_opt, s.phase is None,
                s.eval_t0, records, s.step.attrs if s.step is not None else None)
    finally:
        _recorder.install(None)


def test_fields_read_where_they_lie_follow_a_changed_type() -> None:
    """`_loops` reads the recorder's objects' fields at the offsets it learnt for their type; a
    type changed since (a property over `Recorder.step`, then removed) is looked up again, so
    the step machine sees what Python's lookup sees."""
    from otel_train.detect.state import State
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import FakeClock

    class Shadowed(_recorder.Recorder):
        """A recorder class of its own, changed below."""

    def closes() -> bool:
        """Whether `close` closes the step detection opened: only where `r.step` reads it."""
        clock = FakeClock()
        r = Shadowed(64, clock)
        _recorder.install(r)
        try:
            s = State()
            s.step = _recorder.Step(None, None, None).__enter__()
            clock.advance(1_000)
            _loops.close(r, s, clock.perf_ns())
            return any(rec[0] != KIND for rec in r.buf)
        finally:
            _recorder.install(None)

    assert closes() and closes()  # learnt, then read where it lies
    Shadowed.step = property(lambda self: None, lambda self, value: None)
    try:
        assert not closes()
    finally:
        del Shadowed.step
    assert closes()


def test_train_activity_matches_the_python_function() -> None:
    """The common path in C, the rest by the Python function: on random moments (our step open
    or not, the user's, accumulation or a manual update, an open update or evaluation, pending
    fetches), the same result and the same state after."""
    outcomes = set()
    for seed in range(600):
        with _all_python():
            python = _activity(seed, machine.train_activity_python)
        c = _activity(seed, _loops.train_activity)
        assert c == python, seed
        outcomes.add(python[0])
        if seed < 100:  # another type than State: its fields read the generic way
            assert _activity(seed, _loops.train_activity, OtherState) == python, seed
    assert outcomes == {"ours", "user", "new"}


def test_train_activity_in_c_takes_the_next_micro_batch() -> None:
    """Gradient accumulation's second forward, in C: the micro-batch counts on, the fetch
    before it is resolved into the open step, nothing else moves."""
    from otel_train.detect.state import PH_FWD, State
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import FakeClock
    r = _recorder.Recorder(64, FakeClock())
    _recorder.install(r)
    try:
        s = State()
        s.step = step = _recorder.Step(None, None, None).__enter__()
        s.mb, s.mb_fwd, s.mb_bwd, s.uses_opt, s.data_driven = 0, True, True, True, True
        src = object()
        s.pending.append([DATA, 10, 12, src, None, (4, 0)])
        assert _loops.train_activity(r, s, 20, PH_FWD) is step
        assert (s.mb, s.mb_fwd, s.mb_bwd, s.pending, s.cover, s.train_src) == (1, False, False, [], [10, 12], src)
        assert [(rec[1], rec[5], rec[6], rec[7]) for rec in r.buf] == [(DATA, 10, 12, {"train.micro_batch": 1})]
        assert step.attrs == {"train.samples": 4}
    finally:
        _recorder.install(None)


def test_the_detection_tests_pass_with_the_python_fallback() -> None:
    """No compiler at install time means no `_loops`: detection must work the same without it."""
    from support.procs import pytest_without
    check = ("from otel_train.detect import batch_size, coverage, machine, sites\n"
             "assert machine.train_activity is machine.train_activity_python\n"
             "assert (coverage.gaps, sites.user_frames) == (coverage.gaps_python, sites.user_frames_python)\n"
             "assert batch_size.size_of is batch_size.size_of_python\n"
             "from otel_train.detect import optimizer, phase\n"
             "assert (optimizer.optimizer_begin, optimizer.zero_grad_run) == (optimizer.optimizer_begin_python,"
             " optimizer._zero_grad)\n"
             "assert (phase.part_begin, phase.end) == (phase.part_begin_python, phase.end_python)")
    proc = pytest_without("otel_train.detect._loops", check, ["tests/test_detect_edges.py",
                          "tests/test_detect_phase.py", "tests/test_detect_batch_size.py"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


def _forward_moment(seed: int, begin, end) -> tuple:
    """A random forward on the process's detection state (reset first): the pre-hook's body
    (`begin`), maybe a nested forward, then the post-hook's (`end`). Returns what changed."""
    import torch
    from otel_train.detect.roots import Roots, roots
    from otel_train.detect.state import s
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import FakeClock
    rng = random.Random(seed)
    clock = FakeClock()
    r = _recorder.Recorder(4096, clock) if rng.random() < 0.9 else None
    unseen_method = Roots.unseen
    _recorder.install(r)
    discovering = roots.discovering
    s.reset()
    try:
        roots.discovering = rng.random() < 0.1
        module = rng.choice([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).eval(), torch.nn.MSELoss()])
        s.fetching = rng.random() < 0.1
        s.opt_depth = int(rng.random() < 0.1)
        s.mb, s.mb_fwd, s.mb_bwd = rng.choice([0, 1]), rng.random() < 0.5, rng.random() < 0.5
        s.uses_opt, s.data_driven = True, rng.choice([None, True])
        # the step's update done before this forward (a sample after it), after it, or not yet
        opt_end = rng.choice([None, 1, 2**62])
        if r is not None and rng.random() < 0.7:
            s.step = _recorder.Step(None, None, None).__enter__()
            s.opt_end = opt_end
        if rng.random() < 0.3:
            s.pending.append([DATA, 1, 2, None, None, (2, 0)])
        first = next(_recorder.seq)
        with torch.set_grad_enabled(rng.random() < 0.85):
            clock.advance(10)
            begin(module)
            depth_after_begin = s.fwd_depth
            if rng.random() < 0.3:  # a submodule's forward inside it
                begin(module)
                end(module)
            clock.advance(10)
            end(module)
        records = _records(r, first)
        return (depth_after_begin, s.fwd_depth, s.fwd_kind, s.fwd_nested, s.copying, s.mb, s.mb_fwd, s.mb_bwd,
                s.cover, s.last_end, s.pending, s.fwd_region is None, s.eval_t0, s.eval_t1, s.opt_end,
                s.step.micro_batches if s.step is not None else None, records)
    finally:
        roots.discovering = discovering
        s.reset()
        _recorder.install(None)


def test_forward_hooks_match_the_python_bodies() -> None:
    """The forward hooks' common paths in C, the rest by the Python bodies: on random forwards
    (training, evaluation, a loss module, nested, inside a fetch or an update, not recording,
    discovering roots), the same state and records after."""
    from otel_train.detect import forward
    kinds = set()
    extended = False
    for seed in range(500):
        python = _forward_moment(seed, forward.forward_begin_python, forward.forward_end_python)
        c = _forward_moment(seed, _loops.forward_begin, _loops.forward_end)
        assert c == python, seed
        extended = extended or python[14] not in (None, 1, 2**62)
        kinds.add((python[2], bool(python[-1])))
    assert {(0, True), (1, True)} <= kinds  # training forwards recorded, evaluations seen
    assert extended  # a forward after the update moved the update's end (`forward_end_python`)


def _backward_moment(seed: int, run) -> tuple:
    """A random backward on the process's detection state (reset first), through `run`
    (original, args, kwargs): it returns or raises. Returns what came out and what changed."""
    from otel_train.detect import phase
    from otel_train.detect.roots import Roots, roots
    from otel_train.detect.state import s
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import FakeClock
    rng = random.Random(seed)
    clock = FakeClock()
    r = _recorder.Recorder(4096, clock) if rng.random() < 0.9 else None
    unseen_method = Roots.unseen
    _recorder.install(r)
    discovering = roots.discovering
    unseen: list = []
    Roots.unseen = lambda self, n: unseen.append(n)  # a rediscovery asked for: noted, not done (it hooks globally)
    s.reset()
    try:
        roots.discovering = rng.random() < 0.2
        s.mb, s.mb_fwd, s.mb_bwd = rng.choice([0, 1]), rng.random() < 0.7, rng.random() < 0.5
        s.uses_opt, s.data_driven = True, rng.choice([None, True])
        if r is not None and rng.random() < 0.7:
            s.step = _recorder.Step(None, None, None).__enter__()
        if r is not None and rng.random() < 0.15:  # inside step(closure): the update's part runs
            s.opt_depth, s.opt_closure = 1, True
            if rng.random() < 0.5:
                phase.part_begin(s, phase.STEP)
        raises = rng.random() < 0.2
        calls = []

        def original(*args, **kwargs):
            calls.append((args, kwargs))
            clock.advance(50)
            if raises:
                raise ValueError("in backward")
            return "grads"

        first = next(_recorder.seq)
        clock.advance(10)
        try:
            out = run(original, (1, 2), {"retain_graph": True})
        except ValueError as err:
            out = ("raised", str(err))
        phase_open = s.phase is not None
        phase.abandon(s)
        records = _records(r, first)
        return (out, calls, s.bwd_depth, s.mb, s.mb_fwd, s.mb_bwd, s.cover, s.last_end, phase_open,
                s.step.micro_batches if s.step is not None else None, [n is not None for n in unseen], records)
    finally:
        roots.discovering = discovering
        Roots.unseen = unseen_method
        s.reset()
        _recorder.install(None)


def test_backward_matches_the_python_body() -> None:
    """The backward's common path in C, the rest by the Python body: on random backwards (in
    the open step or not, raising, nested in a closure's update, not recording), the same
    result, exception, state and records after."""
    from otel_train.detect import backward
    outcomes, unseen = set(), False
    for seed in range(400):
        python = _backward_moment(seed, backward.backward_python)
        c = _backward_moment(seed, _loops.backward_run)
        assert c == python, seed
        outcomes.add((python[0] == "grads", bool(python[-1])))
        unseen |= bool(python[-2])
    assert outcomes == {(True, True), (False, True), (True, False), (False, False)}  # (returned, recorded)
    assert unseen  # a backward with no forward seen asked for a rediscovery


def _fetch_moment(seed: int, fetch) -> tuple:
    """A random batch fetch on the process's detection state (reset first), through `fetch`
    (original, iterator): a batch, or the loader's end. Returns what came out and changed."""
    import torch
    from otel_train.detect import data, phase
    from otel_train.detect.state import s
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import FakeClock
    rng = random.Random(seed)
    clock = FakeClock()
    r = _recorder.Recorder(4096, clock) if rng.random() < 0.9 else None
    _recorder.install(r)
    needed = data.copy_edge.needed
    s.reset()
    try:
        data.copy_edge.needed = rng.choice([True, False])
        s.mb_bwd, s.data_driven = rng.random() < 0.6, rng.choice([None, True, True, False])
        s.uses_opt = rng.choice([True, False, None])
        s.opt_end = rng.choice([None, 7])
        if r is not None and rng.random() < 0.7:
            s.step = _recorder.Step(None, None, None).__enter__()
        if r is not None and rng.random() < 0.2:  # the update's phase open
            phase.part_begin(s, phase.STEP)
            clock.advance(3)
            phase.part_end(r, s)

        class Iterator:
            pass
        iterator = Iterator()
        if rng.random() < 0.8:
            iterator._index_sampler = "sampler"
        end = rng.random() < 0.15
        batch = rng.choice([torch.zeros(3, 2), (torch.zeros(5, 4, dtype=torch.long), 1), "odd"])

        def original(it):
            assert it is iterator and s.fetching == (r is not None)
            clock.advance(40)
            if end:
                raise StopIteration
            return batch

        first = next(_recorder.seq)
        clock.advance(10)
        try:
            out = fetch(original, iterator)
        except StopIteration:
            out = "end"
        step_closed = s.step is None
        records = _records(r, first)
        pending = [[e[0], e[1], e[2], e[3], e[4] is iterator, e[5]] for e in s.pending]
        return (out is batch or out, s.fetching, s.copying, pending, step_closed, s.phase is None, s.opt_end,
                s.boundary, s.uses_opt, records)
    finally:
        data.copy_edge.needed = needed
        phase.abandon(s)
        s.reset()
        _recorder.install(None)


def test_fetch_matches_the_python_body() -> None:
    """A batch fetch in C, against the Python body: on random fetches (the loader's end, a
    step to close after its update or its backward, an open update, not recording), the same
    result, state and records after."""
    from otel_train.detect import data
    outcomes = set()
    for seed in range(400):
        python = _fetch_moment(seed, data.fetch_python)
        c = _fetch_moment(seed, _loops.fetch)
        assert c == python, seed
        outcomes.add((python[0] is True, python[4]))
    assert outcomes == {(True, True), (True, False), (False, True), (False, False)}  # (a batch, step closed)


@contextlib.contextmanager
def _phase_python():
    """The optimizer phase's Python functions where the Python bodies call them."""
    from otel_train.detect import phase
    saved = phase.part_begin, phase.part_end, phase.end
    phase.part_begin, phase.part_end, phase.end = phase.part_begin_python, phase.part_end_python, phase.end_python
    try:
        yield
    finally:
        phase.part_begin, phase.part_end, phase.end = saved


def _ours(source: str):
    """A function of a module `sites` looks through (as the hooks and the patched zero_grad
    are), from its source."""
    namespace = {"__name__": "otel_train.tests_stand_in"}
    exec(source, namespace)
    return namespace[source.split()[1].split("(")[0]]


#: The patched zero_grad (`optimizer.aux_patch`) past its checks: `run(r, s, original, args, kwargs)`.
patched = _ours("def patched(run, r, s, original, a, k):\n    return run(r, s, original, a, k)\n")
#: The optimizer's pre- or post-hook past its compile check: `run(optimizer, args, kwargs)`.
opt_hook = _ours("def opt_hook(run, optimizer, a, k):\n    return run(optimizer, a, k)\n")


def _update_moment(seed: int, begin, end, zero_grad, end_phase, clip) -> tuple:
    """A random update on the process's detection state (reset first): maybe a gradient clipping
    first through `clip` (r, s, original, args, kwargs), maybe raising, the optimizer's pre-hook
    body (`begin`) called as torch's step wrapper calls the hook, maybe a nested update, the
    post-hook's (`end`), maybe a zero_grad through `zero_grad` (r, s, original, args, kwargs)
    from a call site decided or not, then the phase recorded (`end_phase`). Returns what changed."""
    import torch
    from otel_train.detect import phase, sites
    from otel_train.detect.state import s
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import FakeClock
    rng = random.Random(seed)
    clock = FakeClock()
    r = _recorder.Recorder(4096, clock) if rng.random() < 0.9 else None
    _recorder.install(r)
    s.reset()
    sites.forget()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    try:
        s.mb, s.mb_fwd, s.mb_bwd = rng.choice([0, 1]), rng.random() < 0.8, rng.random() < 0.8
        s.uses_opt, s.data_driven = rng.choice([True, False, None]), rng.choice([None, True, True, False])
        s.site_probe = rng.random() < 0.2
        if r is not None and rng.random() < 0.8:
            s.step = _recorder.Step(None, None, None).__enter__()
            s.opt_end = rng.choice([None, None, 5])
            if rng.random() < 0.5:
                s.stepped.append(id(opt))
        closure = rng.choice([None, None, None, lambda: 1.0])
        args = (opt, closure) if closure is not None and rng.random() < 0.5 else (opt,)
        kwargs = {"closure": closure} if closure is not None and len(args) == 1 else {}

        def hook(optimizer, a, k):
            return opt_hook(begin if k is kwargs else end, optimizer, a, k)

        wrapper_frames = []

        def wrapper(nested: bool):  # torch's step wrapper
            wrapper_frames.append(sys._getframe())
            hook(opt, args, kwargs)
            clock.advance(100)
            if nested:
                wrapper(False)
            hook(opt, args, dict(kwargs))

        first = next(_recorder.seq)
        clock.advance(10)
        clipped = clip_state = None
        if r is not None and rng.random() < 0.5:  # the patched clip_grad_norm_ calls `clip` only while recording
            clip_raises = rng.random() < 0.15

            def clip_original(*a, **k):
                clock.advance(20)
                if clip_raises:
                    raise ValueError("in clip_grad_norm_")
                return (a, k)

            try:
                clipped = patched(clip, r, s, clip_original, (3,), {"max_norm": 1.0})
            except ValueError as err:
                clipped = ("raised", str(err))
            clip_state = (s.phase is None, list(s.phase_parts), s.part_phase is None, s.aux_depth, s.last_end,
                          s.opt_end, list(s.cover), _recorder.current_get() is None)
            clock.advance(3)
        wrapper(rng.random() < 0.1)
        after_update = (s.opt_depth, s.opt_owner is None, s.opt_closure, s.nest, s.opt_t0, s.evaluations,
                        s.opt_frame is None, s.phase is None, list(s.phase_parts), s.phase_end,
                        s.part_phase is None, s.opt_end, s.last_end, [i == id(opt) for i in s.stepped], s.uses_opt,
                        s.data_driven, list(s.cover), s.site_probe,
                        [(c.co_name, lasti) for c, lasti in s.step_site or ()],
                        None if s.last_callers is None else (s.last_callers[0] == id(wrapper_frames[0].f_back),
                                                              s.last_callers[1].co_name, s.last_callers[2],
                                                              s.last_callers[4].co_name),
                        _recorder.current_get() is None)
        s.opt_frame = s.last_callers = s.step_site = None
        raises = rng.random() < 0.2
        out = None
        if rng.random() < 0.8:
            def original(*a, **k):
                clock.advance(30)
                if raises:
                    raise ValueError("in zero_grad")
                return (a, k)

            def user(zero_grad, *a, **k):  # the user's code, calling the patched zero_grad
                return patched(zero_grad, r, s, original, a, k)

            lasti = user(lambda *x: sys._getframe(2).f_lasti)
            if rng.random() < 0.7:
                place = rng.choice([sites.END, sites.END, sites.TOP, sites.ELSEWHERE])
                sites._decided[(id(user.__code__), lasti)] = (user.__code__, place)
            clock.advance(5)
            try:
                out = user(zero_grad, 1, set_to_none=True) if r is not None else None
            except ValueError as err:
                out = ("raised", str(err))
        in_zero_grad = (s.phase is None, list(s.phase_parts), s.phase_end, s.part_phase is None, s.opt_end,
                        s.last_end, list(s.cover), s.aux_depth, [e[:3] for e in s.pending], s.step is None,
                        _recorder.current_get() is None)
        clock.advance(7)
        if r is not None:
            end_phase(r, s)
        records = _records(r, first)
        decided = sorted(place for _, place in sites._decided.values())
        return (clipped, clip_state, after_update, out, in_zero_grad, s.phase is None, list(s.cover), decided, records)
    finally:
        phase.abandon(s)
        s.reset()
        sites.forget()
        _recorder.install(None)


def test_optimizer_phase_matches_the_python_bodies() -> None:
    """The optimizer's hooks, clipping, zero_grad and the phase's functions in C, the rest by the
    Python bodies: on random updates (a clipping first or not, nested, with a closure, while
    probing the call sites, in the open step or not, a zero_grad decided at the end, the top or
    elsewhere, raising, not recording),
    the same state, result, exception and records after."""
    from otel_train.detect import optimizer, phase
    paths, clips = set(), set()
    for seed in range(600):
        with _phase_python():
            python = _update_moment(seed, optimizer.optimizer_begin_python, optimizer.optimizer_end_python,
                                    optimizer._zero_grad, phase.end_python, optimizer._clip)
        c = _update_moment(seed, _loops.optimizer_begin, _loops.optimizer_end, _loops.zero_grad_run,
                           _loops.phase_end, _loops.clip_run)
        assert c == python, seed
        parts = python[4][1]
        joined = parts[-2:] == ["step", "zero_grad"]
        paths.add((bool(python[-1]), joined, python[3] is not None and python[3][0] == "raised"))
        clips.add((python[1] is not None and python[1][1][:1] == ["clip_grad_norm_"],
                   python[0] is not None and python[0][0] == "raised"))
    # (recorded, zero_grad joined the update, it raised): each way a zero_grad went
    assert {(True, True, False), (True, True, True), (True, False, False), (True, False, True),
            (False, False, False)} <= paths, paths
    # (the clipping began the update's phase, it raised): each way a clipping went (or none came)
    assert {(True, False), (True, True), (False, False)} <= clips, clips


def test_optimizer_phase_in_c_joins_zero_grad_at_the_end() -> None:
    """The common path itself: an update of the open step, then a zero_grad whose call site was
    decided as the end of it, make one train.optimizer span with both calls, all in C (no
    Python body is called)."""
    import torch
    from otel_train import semconv
    from otel_train.detect import optimizer, phase, sites
    from otel_train.detect.state import s
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import FakeClock
    clock = FakeClock()
    r = _recorder.Recorder(64, clock)
    _recorder.install(r)
    s.reset()
    sites.forget()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    called: list[str] = []
    try:
        s.site_probe, s.uses_opt, s.mb_fwd, s.mb_bwd = False, True, True, True
        s.step = _recorder.Step(None, None, None).__enter__()
        _loops.bind_optimizer(s, _recorder, *(lambda *a, name=name: called.append(name)
                                              for name in ("begin", "end", "zero_grad", "several")),
                              sites._decided, sites.END)

        def hook(fn):
            return opt_hook(fn, opt, (opt,), {})

        def user(run, *a, **k):  # the user's code, calling the patched zero_grad
            return patched(run, r, s, lambda *x, **y: clock.advance(20), a, k)

        t0 = clock.perf_ns()
        hook(_loops.optimizer_begin)
        clock.advance(100)
        hook(_loops.optimizer_end)
        assert s.opt_end == s.last_end == clock.perf_ns() and s.stepped == [id(opt)]
        lasti = user(lambda *x: sys._getframe(2).f_lasti)  # where the user's code calls zero_grad
        sites._decided[(id(user.__code__), lasti)] = (user.__code__, sites.END)
        clock.advance(5)
        user(_loops.zero_grad_run)
        assert called == []
        assert s.phase_parts == ["step", "zero_grad"] and s.opt_end == s.last_end == clock.perf_ns()
        t1 = clock.perf_ns()
        clock.advance(50)
        phase.end(r, s)
        spans = [(rec[1], rec[5], rec[6], rec[7]) for rec in r.buf if rec[0] == KIND]
        assert spans == [(semconv.SPAN_OPTIMIZER, t0, t1, {semconv.TRAIN_OPTIMIZER_CALLS: ("step", "zero_grad")})]
        assert s.cover == [t0, t1] and s.phase is None
        # and again, many times: nothing of the update's objects is kept or lost on the way
        args, kwargs = (opt,), {}
        before = sys.getrefcount(opt), sys.getrefcount(args), sys.getrefcount(kwargs)
        for _ in range(500):
            s.opt_end, s.stepped = None, []
            opt_hook(_loops.optimizer_begin, opt, args, kwargs)
            opt_hook(_loops.optimizer_end, opt, args, kwargs)
            user(_loops.zero_grad_run)
            phase.end(r, s)
            r.buf.clear()
        s.opt_end, s.stepped, s.opt_owner, s.cover = None, [], None, []
        assert (sys.getrefcount(opt), sys.getrefcount(args), sys.getrefcount(kwargs)) == before
        assert called == []
    finally:
        _loops.bind_optimizer(s, _recorder, optimizer.optimizer_begin_python, optimizer.optimizer_end_python,
                              optimizer._zero_grad, optimizer.several_updates, sites._decided, sites.END)
        phase.abandon(s)
        s.reset()
        sites.forget()
        _recorder.install(None)


def test_the_wrappers_guards_match_the_python_ones_on_random_states() -> None:
    """`fetch_busy`, `backward_busy` and `aux_busy` (the guards each wrapper and each replayed
    call ask) against `data.busy_python`, `backward.busy_python` and `optimizer.aux_busy_python`."""
    from otel_train.detect import backward, data, optimizer
    from otel_train.detect.state import State

    pairs = ((_loops.fetch_busy, data.busy_python), (_loops.backward_busy, backward.busy_python),
             (_loops.aux_busy, optimizer.aux_busy_python))
    fields = ("fetching", "fwd_depth", "eval_explicit", "bwd_depth", "opt_depth", "aux_depth")
    rng = random.Random(7)
    seen = set()
    for trial in range(2_000):
        s = State()
        for name in fields:
            setattr(s, name, rng.choice([0, 0, 0, 1, 2, True, False, None, [], [0]]))
        for c, python in pairs:
            got = c(s)
            assert got is python(s), (trial, c.__name__, {name: getattr(s, name) for name in fields})
            seen.add((c.__name__, got))
    assert len(seen) == 6  # each guard seen both ways
    assert data.busy is _loops.fetch_busy and backward.busy is _loops.backward_busy
    assert optimizer.aux_busy is _loops.aux_busy


def test_decided_place_matches_the_python_function() -> None:
    """`_loops.decided_place` against `sites.decided_place_python`, asked the way a noted
    zero_grad asks (the user's frame calling a Python function of ours): a decided call site's
    place, None for one not decided, ELSEWHERE where no frame of the user's is near."""
    from otel_train.detect import sites

    ours: dict = {"__name__": "otel_train.detect.fake_hook"}
    exec("def hook(fn, depth=0):\n"  # noqa: S102 - a function that counts as ours, nested `depth` deep
         "    return fn() if depth == 0 else hook(fn, depth - 1)\n", ours)

    def user(fn, depth: int = 0):
        return ours["hook"](fn, depth)

    assert sites.decided_place is _loops.decided_place
    code, key = user(sites._call_site)
    try:
        for place in (sites.TOP, sites.END, sites.ELSEWHERE, None):
            sites._decided.pop(key, None)
            if place is not None:
                sites._decided[key] = (code, place)
            assert user(_loops.decided_place) == user(sites.decided_place_python) == place, place
        deep = sites._MAX_DEPTH + 2  # every frame looked through is ours
        assert user(_loops.decided_place, deep) == user(sites.decided_place_python, deep) == sites.ELSEWHERE
    finally:
        sites._decided.pop(key, None)
