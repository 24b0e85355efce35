"""torchrun's stop (issue 26 item 8): every completed step arrives, any loss is counted.

torchrun stops its workers with `os.killpg(worker, SIGTERM)` (each worker leads its own process
group), so the exporter process each rank started gets SIGTERM with the trainer. It used to die
with what it held (0-85 % of completed steps delivered) while the closing line said "none
dropped". Here a real `torchrun` with two ranks runs until both have completed some steps, the
test sends SIGTERM to torchrun itself, and every step a rank said it completed must have
reached the receiver; each rank's closing line names its rank and counts what it lost.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid

from support.fault_run import settle
from support.otlp_receiver import OTLPReceiver
from support.procs import clean_env

from otel_train import semconv

LOOP = textwrap.dedent("""
    import os, time
    import otel_train
    from otel_train import _runtime
    otel_train.init()
    # The case that lost steps: the exporter process is up and holds what it was sent (it
    # exports every OTEL_BSP_SCHEDULE_DELAY, 5 s) when the signal comes.
    _runtime.state().worker.sink.ready.wait(120)
    rank = int(os.environ["RANK"])
    n = 0
    while True:
        with otel_train.step():
            for name in ("train.data", "train.forward", "train.backward", "train.optimizer"):
                with otel_train.span(name):
                    pass
            time.sleep(0.01)
        n += 1
        print(f"RANK {rank} STEP {n}", flush=True)
""")
STEPS_BEFORE_STOP = 30


def test_torchrun_sigterm_delivers_every_completed_step_of_every_rank(tmp_path) -> None:
    run_id = f"stop-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    with OTLPReceiver() as receiver:
        env = clean_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_TRAIN_RUN_ID": run_id,
                         "OTEL_METRIC_EXPORT_INTERVAL": "600000", "OTEL_TRAIN_FLUSH_INTERVAL_MS": "100"})
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                 "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", run_id,
                                 str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        completed = {0: 0, 1: 0}
        deadline = time.monotonic() + 180
        assert proc.stdout is not None
        while min(completed.values()) < STEPS_BEFORE_STOP and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            found = re.match(r"RANK (\d) STEP (\d+)", line)
            if found:
                completed[int(found.group(1))] = int(found.group(2))
        assert min(completed.values()) >= STEPS_BEFORE_STOP, (completed, proc.stderr.read() if proc.poll() else "")
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # torchrun: os.killpg(each worker, SIGTERM)
        out, err = proc.communicate(timeout=60)
        exit_s = time.monotonic() - stopped
        for line in out.splitlines():  # steps completed between our last read and the signal
            found = re.match(r"RANK (\d) STEP (\d+)", line)
            if found:
                completed[int(found.group(1))] = max(completed[int(found.group(1))], int(found.group(2)))
        spans = settle(receiver, run_id)
    delivered = {rank: sorted(s["attributes"][semconv.TRAIN_STEP] for s in spans
                              if s["name"] == "train.step" and s["resource"][semconv.ML_RANK] == rank
                              and not s["attributes"].get("otel_train.truncated"))
                 for rank in (0, 1)}
    closing = {rank: [line for line in err.splitlines() if f"otel_train: rank {rank}: " in line
                      and "spans exported" in line] for rank in (0, 1)}
    print(f"torchrun SIGTERM: completed {completed}, delivered { {r: len(v) for r, v in delivered.items()} }, "
          f"exit {exit_s:.1f} s after the signal")
    for rank in (0, 1):
        # Every step the rank said it completed arrived, once (steps are numbered from 0).
        assert delivered[rank][:completed[rank]] == list(range(completed[rank])), (rank, delivered[rank], err)
        assert len(closing[rank]) == 1, err  # one closing line per rank, naming its rank
        if "none dropped" in closing[rank][0]:
            exported = int(re.search(rf"rank {rank}: (\d+) spans exported", closing[rank][0]).group(1))
            assert exported == len([s for s in spans if s["resource"][semconv.ML_RANK] == rank]), err
    # torchrun prints its own SignalException traceback; none of ours is in it.
    assert not re.search(r'File "[^"]*otel_train', err), err
