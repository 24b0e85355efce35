"""The pure rules of otel_train.analyze: slow steps, goodput painting, pipeline verdicts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from otel_train.analyze import goodput as gp
from otel_train.analyze.slow import SlowStepRule, flag_slow, ideal_step_time, mad, median, slow_bound
from otel_train.analyze.verdicts import (BALANCED, INFERENCE_BOUND, TRAINING_BOUND, TRANSFER_BOUND,
                                         breakdown_headline, classify)


def test_median_and_unscaled_mad() -> None:
    assert median([3, 1, 2]) == 2 and median([4, 1, 3, 2]) == 2.5
    # scipy.stats.median_abs_deviation([1, 2, 3, 4, 100]) == 1.0 (scale=1.0, its default)
    assert mad([1, 2, 3, 4, 100]) == 1.0


def test_slow_bound_is_median_plus_three_scaled_mad_with_a_floor() -> None:
    times = [100.0, 102.0, 98.0, 101.0, 99.0, 100.0, 130.0]
    assert slow_bound(times) == pytest.approx(105.0)  # MAD 1: 3 sigma is under the 5 % floor
    wide = [100.0, 110.0, 90.0, 120.0, 80.0]
    assert slow_bound(wide) == pytest.approx(100.0 + 3 * 1.4826 * 10.0)
    assert slow_bound([]) is None
    # ml-goodput-measurement's ideal step time: the mean of the steps within the bound
    assert ideal_step_time([100.0, 100.0, 100.0, 400.0]) == pytest.approx(100.0)


def test_rule_judges_each_step_against_the_steps_before_it() -> None:
    rule = SlowStepRule(window=5, min_history=3)
    assert [rule.observe(t) for t in (10.0, 50.0, 10.0)] == [False, False, False]  # not judged yet
    assert rule.observe(10.0) is False
    assert rule.observe(30.0) is True  # median 10, MAD 0 -> bound 10.5
    # the window forgets: after five 30s, 30 is normal
    for _ in range(5):
        rule.observe(30.0)
    assert rule.observe(30.0) is False
    flags = flag_slow([1.0] * 20 + [2.0] + [1.0] * 5)
    assert flags.index(True) == 20 and sum(flags) == 1


def test_paint_gives_each_instant_to_the_highest_priority_category() -> None:
    intervals = [(0, 100, gp.PRODUCTIVE), (10, 20, gp.DATA), (15, 30, gp.CHECKPOINT), (50, 60, gp.GC),
                 (55, 70, gp.DATA), (-5, 5, gp.STARTUP), (200, 300, gp.EVAL)]
    out = gp.paint(0, 250, intervals)
    assert out[gp.CHECKPOINT] == 15  # 15..30 beats data 15..20
    assert out[gp.DATA] == 5 + 10  # 10..15 and 60..70
    assert out[gp.GC] == 10
    assert out[gp.PRODUCTIVE] == 100 - 15 - 15 - 10
    assert out[gp.EVAL] == 50  # clipped at the window's end
    assert out[gp.OTHER] == 100  # 100..200 covered by nothing
    assert out[gp.STARTUP] == 0  # lower priority than productive where they overlap
    assert sum(out.values()) == 250


def test_paint_overlapping_same_category_counts_once() -> None:
    out = gp.paint(0, 10, [(0, 6, gp.DATA), (4, 10, gp.DATA), (2, 8, gp.DATA)])
    assert out[gp.DATA] == 10 and sum(out.values()) == 10


def test_warmup_excess_and_compile() -> None:
    assert gp.warmup_excess([(500, 0), (300, 0), (100, 0), (400, 0)], bound_ns=150, ideal_ns=100) == 400 + 200
    # a warm-up step's data wait is data, not compilation too
    assert gp.warmup_excess([(500, 350), (300, 0), (100, 0)], bound_ns=150, ideal_ns=100) == 50 + 200
    assert gp.warmup_excess([(2_100, 2_000), (100, 0)], bound_ns=150, ideal_ns=100) == 0
    totals = gp.take_compile(dict.fromkeys(gp.CATEGORIES, 0) | {gp.PRODUCTIVE: 1000}, 600)
    assert totals[gp.COMPILE] == 600 and totals[gp.PRODUCTIVE] == 400
    assert gp.take_compile(totals, 10_000)[gp.PRODUCTIVE] == 0
    assert gp.goodput(totals) == pytest.approx(0.4)


@pytest.mark.parametrize(("wait", "util", "verdict"), [
    (0.30, 0.95, INFERENCE_BOUND), (0.30, 0.40, TRANSFER_BOUND), (0.02, 0.30, TRAINING_BOUND),
    (0.02, 0.90, BALANCED)])
def test_pipeline_table(wait: float, util: float, verdict: str) -> None:
    assert classify(wait, util) == verdict


@pytest.mark.parametrize(("wait", "util", "demand_share", "verdict"), [
    (0.30, 0.70, 2.6, INFERENCE_BOUND),  # actors idle between calls, but they cannot supply the demand
    (0.30, 0.70, 0.5, TRANSFER_BOUND), (0.02, 0.70, 0.9, BALANCED), (0.02, 0.30, 0.2, TRAINING_BOUND)])
def test_pipeline_table_with_capacities(wait: float, util: float, demand_share: float, verdict: str) -> None:
    assert classify(wait, util, demand_share) == verdict


def test_breakdown_headline() -> None:
    assert breakdown_headline({"train.data": 0.31, "train.forward": 0.5}) == "data wait 31% of step time"
    assert breakdown_headline({"train.data": 0.02, "train.forward": 0.3, "train.backward": 0.6}) == \
        "backward 60% of step time"
    assert breakdown_headline({"train.forward": 0.05, "(outside phase spans)": 0.79}) == \
        "79% of step time outside phase spans (code between the phases)"


def test_the_rules_import_nothing_heavy() -> None:
    """The exporter process can reuse slow and goodput: standard library only."""
    code = ("import sys; import otel_train.analyze.slow, otel_train.analyze.goodput; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'opentelemetry', 'numpy', 'grpc', 'google')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
