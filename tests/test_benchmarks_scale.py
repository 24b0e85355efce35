"""`python -m benchmarks.scale` on a small setting (32 simulated ranks), sent to the suite's receiver:
what it reports is what arrived, one trace per setting, with the sampled set of ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from support.otlp_receiver import OTLPReceiver
from support.procs import clean_env

from benchmarks.scale import Shape, main, run_id

from otel_train import semconv
from otel_train.wire.sampling import sampled_ranks

WORLD = 32
SETTINGS = ("all", "0", "first-per-node", "sample:4", "sample:4/sampled")


def test_every_setting_reports_what_the_receiver_got(fresh_receiver: OTLPReceiver,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--ranks", str(WORLD), "--settings", ",".join(SETTINGS), "--micro-batches", "1",
                 "--collectives", "3", "--endpoint", fresh_receiver.grpc_endpoint, "--json"]) == 0
    reports = {r["setting"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert list(reports) == list(SETTINGS)
    per_rank = Shape(1, 3).spans  # step + data/forward/backward + optimizer + 3 collectives = 8
    chosen = sampled_ranks(run_id(WORLD, "sample:4"), 1, WORLD, 4)
    phases_from = {"all": set(range(WORLD)), "0": {0}, "first-per-node": {0, 8, 16, 24}, "sample:4": set(chosen),
                   "sample:4/sampled": set(sampled_ranks(run_id(WORLD, "sample:4/sampled"), 1, WORLD, 4))}
    spans = fresh_receiver.spans()
    requests = fresh_receiver.requests_for("traces")
    for setting, report in reports.items():
        mine = [s for s in spans if s["resource"]["ml.run.id"] == run_id(WORLD, setting)]
        steps = {s["resource"]["ml.rank"] for s in mine if s["name"] == semconv.SPAN_STEP}
        phases = {s["resource"]["ml.rank"] for s in mine if s["name"] != semconv.SPAN_STEP}
        assert phases == phases_from[setting], setting
        # every rank's step span, but with OTEL_TRAIN_STEP_SPANS=sampled: rank 0's (the root) and the sampled
        assert steps == (phases | {0} if setting.endswith("/sampled") else set(range(WORLD))), setting
        assert Counter(s["resource"]["ml.rank"] for s in mine) == \
            {r: per_rank if r in phases else 1 for r in steps}
        assert len({s["trace_id"] for s in mine}) == 1  # one step: one trace
        assert report["spans_per_trace"] == len(mine) and report["ranks_with_phases"] == len(phases)
        sent = [r for r in requests if r.message.resource_spans[0].resource.attributes and
                any(kv.key == "ml.run.id" and kv.value.string_value == run_id(WORLD, setting)
                    for kv in r.message.resource_spans[0].resource.attributes)]
        assert report["requests"] == len(sent) == len(steps)  # one request a rank
        assert report["bytes_per_trace"] == sum(r.message.ByteSize() for r in sent)
        assert report["within_limits"] and report["cpu_s"] > 0


def test_with_its_own_receiver_the_counts_agree() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--ranks", "16", "--settings",
                           "all,sample:2", "--json"], capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    reports = [json.loads(line) for line in proc.stdout.splitlines()]
    sampled = len(sampled_ranks(run_id(16, "sample:2"), 1, 16, 2))  # 2, and rank 0 if not one of them
    assert [r["received"] for r in reports] == [r["spans_per_trace"] for r in reports] == \
        [16 * 16, 16 + sampled * 15]


@pytest.mark.parametrize("argv", [["--ranks", "ten"], ["--ranks", "0"], ["--settings", "some"],
                                  ["--settings", "sample:4/half"]])
def test_bad_arguments_get_one_clear_message(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--ranks" in err and "--settings" in err or "--ranks must be positive" in err
