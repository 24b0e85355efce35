"""Rank and step sampling (`OTEL_TRAIN_RANKS`, `wire/sampling.py`): a pure function of run id,
step and rank; phase spans sampled out, step spans and metrics kept on every rank."""

from __future__ import annotations

import json
import logging
import math

import pytest
from support.harness import Harness, by_name
from support.procs import run_python

from otel_train import semconv
from otel_train._config import Config
from otel_train.wire.sampling import DEFAULT, RankSampling, parse_ranks, sampled_in, sampled_ranks


@pytest.mark.parametrize("text,canonical", [("all", "all"), (" ALL ", "all"), ("0", "0"), (0, "0"),
                                            ("16, 0,8,8", "0,8,16"), ("first-per-node", "first-per-node"),
                                            ("sample:4", "sample:4"), ("Sample:04", "sample:4")])
def test_every_form_parses_to_one_spelling(text: object, canonical: str) -> None:
    assert parse_ranks(text) == canonical


@pytest.mark.parametrize("bad", ["", "some", "sample:0", "sample:", "sample:-2", "-1", "0,,1", "first", True, 1.5])
def test_a_bad_value_gets_one_message_and_the_default(bad: object, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError):
        parse_ranks(bad)
    caplog.set_level(logging.WARNING, "otel_train")
    assert Config.resolve({}, {"OTEL_TRAIN_RANKS": str(bad)} if str(bad).strip() else {}).ranks == DEFAULT
    if str(bad).strip():
        (message,) = [r.getMessage() for r in caplog.records]
        assert "OTEL_TRAIN_RANKS" in message and "sample:K" in message and repr(DEFAULT) in message


def test_sample_k_takes_exactly_k_ranks_each_step_and_rotates() -> None:
    for world, k in ((1024, 16), (10, 3), (12, 8), (7, 7), (5, 9)):
        period = world // math.gcd(k, world)
        for first in (0, period, 7 * period):
            seen: set[int] = set()
            for step in range(first, first + period):
                chosen = sampled_ranks("run-a", step, world, k)
                assert 0 in chosen  # rank 0 always: the reference
                assert len(chosen) in (min(k, world), k + 1), (world, k, step)
                seen |= set(chosen)
            assert len(seen) == world  # every rank gets its turn within W / gcd(K, W) steps
    # not one fixed order: the turns are dealt anew every period
    assert [sampled_ranks("run-a", n, 1024, 16)[1] for n in range(64)] != \
        [sampled_ranks("run-a", n, 1024, 16)[1] for n in range(64, 128)]
    # spread over the ranks, not one node's block: the K of 1,024 are 64 apart
    chosen = [r for r in sampled_ranks("run-a", 3, 1024, 16) if r]
    rotating = chosen if len(chosen) == 16 else [0] + chosen
    assert {(b - a) % 1024 for a, b in zip(rotating, rotating[1:] + rotating[:1])} == {64}
    assert sampled_ranks("run-a", 3, 1024, 16) != sampled_ranks("run-b", 3, 1024, 16)


def test_every_process_decides_alike() -> None:
    """The decision needs no communication: another process computes the same sets."""
    code = """
        import json
        from otel_train.wire.sampling import sampled_ranks
        print(json.dumps([sampled_ranks("run-x", s, 100, 5) for s in range(50)]))
    """
    assert json.loads(run_python(code).stdout) == [sampled_ranks("run-x", s, 100, 5) for s in range(50)]


def test_fixed_choices_and_step_sampling() -> None:
    def phases(spec: str, rank: int, local: int = 0, steps: int = 1) -> list[bool]:
        sampling = RankSampling(spec, "r", rank, local, 8, steps)
        return [sampling.phases(n) for n in range(4)]

    assert phases("all", 5) == [True] * 4
    assert phases("0", 0) == [True] * 4 and phases("0", 1) == [False] * 4
    assert phases("1,5", 5) == [True] * 4
    assert phases("first-per-node", 4, local=0) == [True] * 4 and phases("first-per-node", 5, local=1) == [False] * 4
    assert phases("all", 3, steps=2) == [True, False, True, False]
    assert phases("sample:8", 3) == [True] * 4  # K >= world: everyone
    assert [sampled_in("r", n, 3, 8, 2) for n in range(4)] == phases("sample:2", 3)
    assert RankSampling("0", "r", 1, 1, 8, 2).step(2) and not RankSampling("0", "r", 1, 1, 8, 2).step(3)


def test_a_rank_sampled_out_keeps_its_step_spans_siblings_and_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    import otel_train

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    harness = Harness(ranks="0")
    for _ in range(3):
        with otel_train.step():
            with otel_train.span(semconv.SPAN_FORWARD):
                harness.clock.advance(2_000_000)
            with otel_train.span(semconv.SPAN_BACKWARD, micro_batch=0):
                harness.clock.advance(3_000_000)
        with otel_train.span(semconv.SPAN_CHECKPOINT):
            harness.clock.advance(1_000_000)
    spans = harness.finish()
    assert {s.name for s in spans} == {semconv.SPAN_STEP, semconv.SPAN_CHECKPOINT}
    assert len(by_name(spans, semconv.SPAN_STEP)) == 3 and len(by_name(spans, semconv.SPAN_CHECKPOINT)) == 3
    phases = {p.attributes["phase"]: p.count for p in harness.metric_points(semconv.METRIC_PHASE_DURATION)}
    assert phases == {semconv.SPAN_FORWARD: 3, semconv.SPAN_BACKWARD: 3}
    (steps,) = harness.metric_points(semconv.METRIC_STEP_DURATION)
    assert steps.count == 3


def test_sample_k_exports_the_phases_of_the_steps_this_rank_is_chosen_for(monkeypatch: pytest.MonkeyPatch) -> None:
    import otel_train

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    harness = Harness(ranks="sample:2", run_id="run-s")
    for _ in range(24):
        with otel_train.step():
            with otel_train.span(semconv.SPAN_FORWARD):
                harness.clock.advance(1_000_000)
    spans = harness.finish()
    chosen = [n for n in range(24) if 3 in sampled_ranks("run-s", n, 8, 2)]
    assert 0 < len(chosen) < 24
    assert sorted(s.attributes[semconv.TRAIN_STEP] for s in by_name(spans, semconv.SPAN_FORWARD)) == chosen
    assert len(by_name(spans, semconv.SPAN_STEP)) == 24
