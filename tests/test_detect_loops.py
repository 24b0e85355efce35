"""The step machine's per-step work in C (`otel_train/detect/_loops.c`), called directly: the
records a closing step's gaps and the pending fetches make, the frame walk, the guards, the
optimizer phase's common path, and errors raised rather than crashes."""

from __future__ import annotations

import itertools
import random
import sys

import pytest

from otel_train import semconv
from otel_train.detect import coverage

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
    innermost calls the walk and returns what it gives."""
    from otel_train.detect import sites

    scope = {"__name__": "otel_train.detect.sites", "sites": sites, "_loops": _loops}
    exec("def innermost(limit):\n    return _loops.user_frames(limit)\n", scope)
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
def test_user_frames_skip_torch_and_ours(names: list[str], limit: int) -> None:
    from otel_train.detect import sites
    _loops.bind(sites._OURS, sites._MAX_DEPTH)
    c = _chain(names)(limit)
    assert len(c) <= limit
    want = expected(names, limit)
    assert [f.f_globals["__name__"] for f in c][:len(want)] == want  # then this test's callers, if room


def expected(names: list[str], limit: int) -> list[str]:
    """The walk written out on the names: innermost first, `_MAX_DEPTH` frames looked at
    (the innermost, ours, is the first), torch's and ours skipped, at most `limit`."""
    from otel_train.detect import sites
    looked = ["otel_train.detect.sites"] + names[::-1]
    users = [n for n in looked[:sites._MAX_DEPTH] if not (n.startswith(("torch.", "otel_train.")) or n == "torch")]
    return users[:limit]


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
        _loops.bind_optimizer(s, _recorder, optimizer.optimizer_begin_rest, optimizer.optimizer_end_rest,
                              optimizer.zero_grad_rest, optimizer.several_updates, sites._decided, sites.END)
        phase.abandon(s)
        s.reset()
        sites.forget()
        _recorder.install(None)


def test_the_wrappers_guards_on_random_states() -> None:
    """`fetch_busy`, `backward_busy` and `aux_busy` (the guards each wrapper and each replayed
    call ask): a fetch inside a fetch, a forward or a framework's evaluation; a backward inside a
    backward or an evaluation; a zero_grad or clipping inside an update, another such call, a
    forward or a backward. Always a bool."""
    from otel_train.detect import backward, data, optimizer
    from otel_train.detect.state import State

    rules = ((_loops.fetch_busy, ("fetching", "fwd_depth", "eval_explicit")),
             (_loops.backward_busy, ("bwd_depth", "eval_explicit")),
             (_loops.aux_busy, ("opt_depth", "aux_depth", "fwd_depth", "bwd_depth")))
    fields = ("fetching", "fwd_depth", "eval_explicit", "bwd_depth", "opt_depth", "aux_depth")
    rng = random.Random(7)
    seen = set()
    for trial in range(2_000):
        s = State()
        for name in fields:
            setattr(s, name, rng.choice([0, 0, 0, 1, 2, True, False, None, [], [0]]))
        for c, busy_when in rules:
            got = c(s)
            assert got is any(getattr(s, name) for name in busy_when), (trial, c.__name__)
            seen.add((c.__name__, got))
    assert len(seen) == 6  # each guard seen both ways
    assert data.busy is _loops.fetch_busy and backward.busy is _loops.backward_busy
    assert optimizer.aux_busy is _loops.aux_busy


def test_decided_place_of_a_noted_zero_grad() -> None:
    """`_loops.decided_place`, asked the way a noted
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
            assert user(_loops.decided_place) == place, place
        deep = sites._MAX_DEPTH + 2  # every frame looked through is ours
        assert user(_loops.decided_place, deep) == sites.ELSEWHERE
    finally:
        sites._decided.pop(key, None)
