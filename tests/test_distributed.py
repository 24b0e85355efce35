"""Run identity, ranks, deterministic ids and W3C propagation."""

from __future__ import annotations

import json
import os

from support.procs import run_python

from otel_train._distributed import detect_run_info
from otel_train.wire.ids import (StepIds, format_traceparent, parse_traceparent, region_span_id, step_span_id,
                                 trace_id_for)


def test_ranks_and_run_id_from_torchrun_variables() -> None:
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "job-7",
           "TORCHELASTIC_RESTART_COUNT": "2"}
    run = detect_run_info(None, "trainer", env)
    assert (run.run_id, run.rank, run.local_rank, run.world_size, run.node_rank, run.restart) == \
        ("job-7", 3, 1, 8, 1, 2)
    assert detect_run_info("explicit", "trainer", env).run_id == "explicit"


def test_torchrun_without_rdzv_id_shares_a_generated_id_across_local_ranks() -> None:
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "none"}
    rank0 = detect_run_info(None, "trainer", {**base, "RANK": "0"})
    rank1 = detect_run_info(None, "trainer", {**base, "RANK": "1"})
    other_port = detect_run_info(None, "trainer", {**base, "MASTER_PORT": "29501"})
    assert rank0.run_id == rank1.run_id != other_port.run_id
    assert rank0.instance_id != rank1.instance_id


def test_standalone_run_ids_are_unique() -> None:
    assert detect_run_info(None, "trainer", {}).run_id != detect_run_info(None, "trainer", {}).run_id


def test_bad_rank_variable_is_reported(caplog) -> None:
    run = detect_run_info("r", "trainer", {"RANK": "zero"})
    assert run.rank == 0 and "RANK='zero'" in caplog.text


def test_trace_ids_are_deterministic_across_processes_and_distinct_per_step() -> None:
    code = """
        import json
        from otel_train.wire.ids import trace_id_for, step_span_id
        print(json.dumps([trace_id_for("run-a", 5), step_span_id("run-a", 5, 0), step_span_id("run-a", 5, 3)]))
    """
    other = json.loads(run_python(code).stdout)
    assert other == [trace_id_for("run-a", 5), step_span_id("run-a", 5, 0), step_span_id("run-a", 5, 3)]
    ids = {trace_id_for("run-a", n) for n in range(1000)} | {trace_id_for("run-b", 5), trace_id_for("run-a", None)}
    assert len(ids) == 1002
    assert all(0 < t < 2**128 for t in ids)
    assert step_span_id("run-a", 5, 0, restart=1) != step_span_id("run-a", 5, 0)


def test_the_exporters_step_ids_are_the_same_ids_as_bytes() -> None:
    ids = StepIds("run-a", rank=3, restart=2)
    for step in (0, 1, 5, 10**12):
        assert ids.trace(step) == trace_id_for("run-a", step).to_bytes(16, "big")
        assert ids.step_span(step) == step_span_id("run-a", step, 3, 2).to_bytes(8, "big")
        assert ids.both(step) == (ids.trace(step), ids.step_span(step))


def test_region_span_ids_are_unique_and_nonzero() -> None:
    salt = int.from_bytes(os.urandom(8), "big")
    ids = {region_span_id(salt, seq) for seq in range(1, 100_001)}
    assert len(ids) == 100_000 and 0 not in ids and max(ids) < 2**64


def test_region_span_ids_are_pinned() -> None:
    """`wire.ids.region_wire_id` is the one definition of a region's span id (the exporter's C
    computes the same: `test_fast_path.py`). Its values must not change: `inject()` hands them
    out before the exporter writes them, and files from an older version must still join."""
    salt = 0xDEADBEEF12345678
    assert [region_span_id(salt, seq) for seq in (1, 2, 2**40)] == [0x6D2A7E6D56C79A40, 0x52AEA0EC9D4DC3E2,
                                                                     0x78563412EFABD194]


def test_traceparent_roundtrip_and_rejects() -> None:
    header = format_traceparent(0xABC, 0xDEF)
    assert header == "00-00000000000000000000000000000abc-0000000000000def-01"
    assert parse_traceparent({"traceparent": header}) == (0xABC, 0xDEF)
    assert parse_traceparent(header) == (0xABC, 0xDEF)
    for bad in (None, {}, {"traceparent": 5}, "00-xyz-abc-01", "00-" + "0" * 32 + "-" + "1" * 16 + "-01",
                "00-" + "g" * 32 + "-" + "1" * 16 + "-01"):
        assert parse_traceparent(bad) is None


def test_a_rank_the_process_group_contradicts_is_said_once(tmp_path) -> None:
    """Issue 54 #1: a process started as rank 1 of 2 by its environment whose
    `init_process_group(rank=0, world_size=1)` says otherwise is told once, naming both."""
    import socket

    from support.procs import run_python
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = f"""
        import otel_train.auto
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
        dist.destroy_process_group()
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port + 0}", rank=0, world_size=1)
        dist.destroy_process_group()
    """
    proc = run_python(code, env={"RANK": "1", "WORLD_SIZE": "2", "OTEL_TRACES_EXPORTER": "none",
                                 "OTEL_METRICS_EXPORTER": "none"}, cwd=tmp_path)
    said = [line for line in proc.stderr.splitlines() if "torch.distributed says this process is rank 0 of 1" in line]
    assert len(said) == 1 and "as rank 1 of 2" in said[0], proc.stderr
