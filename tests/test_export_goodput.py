"""`otel_train.export.goodput`: goodput and slow steps as the exporter keeps them, step by step.

Scripted times in ns (no clock at all): every category is planted and checked exactly, and the
categories add up to the window by construction.
"""

from __future__ import annotations

import pytest

from otel_train import semconv
from otel_train.analyze import goodput as gp
from otel_train.export.goodput import RunAccount, summary_line

MS = 1_000_000


def _steady(account: RunAccount, start: int, steps: int, step_ns: int = 100 * MS) -> int:
    """`steps` back-to-back steps of `step_ns` from `start`; returns the end of the last one."""
    t = start
    for _ in range(steps):
        account.step(t, t + step_ns, step_ns / 1e9)
        t += step_ns
    return t


def test_categories_are_the_planted_times_and_add_up_to_the_window() -> None:
    account = RunAccount(start_ns=0)
    t = 2_000 * MS  # 2 s of start-up before the first step
    t = _steady(account, t, 10)
    account.sibling(semconv.SPAN_CHECKPOINT, t, t + 300 * MS)  # after step 9, before step 10
    t += 300 * MS
    account.sibling(semconv.SPAN_GC, t + 10 * MS, t + 30 * MS)  # a GC pause inside step 10
    account.data(25 * MS)  # data wait inside step 10 (fast-path regions give durations only)
    t = _steady(account, t, 10)
    account.sibling(semconv.SPAN_EVAL, t, t + 500 * MS)  # a final evaluation: after the last step
    account.sibling(semconv.SPAN_BENCH_LATENCY, t + 500 * MS, t + 600 * MS)  # no category: `other`
    seconds = {c: ns / 1e9 for c, ns in account.snapshot().items()}
    assert seconds == pytest.approx({gp.STARTUP: 2.0, gp.CHECKPOINT: 0.3, gp.GC: 0.02, gp.DATA: 0.025,
                                     gp.PRODUCTIVE: 2.0 - 0.02 - 0.025, gp.EVAL: 0.5, gp.OTHER: 0.1,
                                     gp.COMPILE: 0.0, gp.RESTART: 0.0})
    assert sum(account.snapshot().values()) == t + 600 * MS  # the whole window, exactly
    summary = account.summary()
    assert summary["wall_s"] == pytest.approx(4.9) and summary["goodput"] == pytest.approx(1.955 / 4.9)


def test_a_step_over_median_plus_3_mad_is_slow_and_only_it() -> None:
    account = RunAccount(start_ns=0)
    t = _steady(account, 0, 20)
    assert account.step(t, t + 300 * MS, 0.3)  # the planted slow step
    t += 300 * MS
    assert not account.step(t, t + 104 * MS, 0.104)  # within the 5 % floor of a steady run
    assert account.slow_steps == 1 and account.steps == 22


def test_the_first_steps_are_judged_only_once_ten_were_seen() -> None:
    account = RunAccount(start_ns=0)
    flags = [account.step(i * MS, (i + 1) * MS, t) for i, t in enumerate([5.0] + [0.1] * 8 + [0.5])]
    assert not any(flags)  # warm-up: no history to judge against yet


def test_the_warm_up_excess_is_compilation() -> None:
    account = RunAccount(start_ns=0)
    account.step(0, 5_000 * MS, 5.0)  # torch.compile's first step
    account.step(5_000 * MS, 7_000 * MS, 2.0)  # a recompilation
    _steady(account, 7_000 * MS, 30)
    totals = account.snapshot()
    # Both leading steps' excess over the ideal step time (the mean of the normal ones, 100 ms).
    assert totals[gp.COMPILE] == pytest.approx(4.9e9 + 1.9e9)
    assert totals[gp.PRODUCTIVE] == pytest.approx(10e9 - 6.8e9)


def test_after_an_elastic_restart_the_start_up_is_lost_to_the_restart() -> None:
    account = RunAccount(start_ns=0, restart=1)
    _steady(account, 1_000 * MS, 3)
    totals = account.snapshot()
    assert totals[gp.RESTART] == 1_000 * MS and totals[gp.STARTUP] == 0


def test_before_the_first_step_everything_seen_is_start_up() -> None:
    account = RunAccount(start_ns=0)
    account.sibling(semconv.SPAN_CHECKPOINT, 100 * MS, 400 * MS)  # loading a checkpoint at start
    account.seen(1_000 * MS)
    totals = account.snapshot()
    assert totals[gp.CHECKPOINT] == 300 * MS and totals[gp.STARTUP] == 700 * MS


def test_the_shutdown_line_is_one_line_with_the_badput_shares() -> None:
    account = RunAccount(start_ns=0)
    t = _steady(account, 3_000 * MS, 20)
    account.step(t, t + 400 * MS, 0.4)
    line = summary_line(account.summary(), rank=0)
    assert "\n" not in line
    assert line == ("otel_train: goodput 44.4% of 5.4 s since init on rank 0: startup 55.6%; 1 of 21 steps slow "
                    "(over median + 3 sigma, tagged 'slow')")


def test_a_long_first_data_wait_is_data_once_not_compilation_too() -> None:
    """Issue 55: a first batch that takes 2 s is 2 s of `data`, and the first step's compute is
    productive as in any step; the categories still add up to the window exactly."""
    account = RunAccount(start_ns=0)
    t = 0
    for i in range(15):
        wait = 2_000 * MS if i == 0 else 1 * MS
        account.data(wait)  # the step's train.data, recorded before the step ends
        account.step(t, t + wait + 72 * MS, (wait + 72 * MS) / 1e9)
        t += wait + 72 * MS
    totals = account.snapshot()
    assert sum(totals.values()) == t
    assert totals[gp.DATA] == 2_014 * MS
    assert totals[gp.COMPILE] == 0
    assert totals[gp.PRODUCTIVE] == 15 * 72 * MS  # ~1.08 s, the truth (it was reported as 0)


def test_a_slow_first_forward_is_compilation() -> None:
    """The same 2 s in the first step's compute (not its data wait) is the warm-up's compilation."""
    account = RunAccount(start_ns=0)
    t = 0
    for i in range(15):
        account.data(1 * MS)
        own = (2_000 if i == 0 else 0) * MS + 73 * MS
        account.step(t, t + own, own / 1e9)
        t += own
    totals = account.snapshot()
    assert totals[gp.COMPILE] == pytest.approx(2_000 * MS, abs=1 * MS)  # less the step's usual 1 ms wait
    assert totals[gp.DATA] == 15 * MS and sum(totals.values()) == t


def test_the_run_time_rule_is_the_analysis_rule() -> None:
    """One implementation: the exporter's account tags exactly the steps `diagnose`'s rule flags."""
    from random import Random

    from otel_train.analyze.slow import flag_slow
    rng = Random(3)
    times = [0.05 + rng.expovariate(400) for _ in range(400)] + [0.2] + [0.05] * 20
    account = RunAccount(start_ns=0)
    flags = [account.step(i, i + 1, t) for i, t in enumerate(times)]
    assert flags == flag_slow(times)
    assert flags[400] and account.slow_steps == sum(flags)
