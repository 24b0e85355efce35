"""A trainer fed by two real Ray actors (the TorchSpec seed's pipeline), one run per MODE.

The trainer keeps DEPTH generate requests in flight per actor and takes one result a step
(`otel_train.ray.wait`); each actor's call sleeps GEN_S inside its `infer.generate` span and
TRANSFER_S after it (the result on its way: serialising, pushing it over the network), and the
trainer's step works TRAIN_S. Sleeps, not computation, so the shape holds on a loaded machine.

MODES (comma-separated, each its own run `<RUN_PREFIX>-<mode>` under OTEL_TRAIN_OUTPUT_DIR):

| mode          | GEN_S | TRANSFER_S | TRAIN_S | DEPTH | expected verdict     |
|---------------|-------|------------|---------|-------|----------------------|
| slow_actors   | 0.1   | 0          | 0.01    | 2     | inference-bound      |
| slow_trainer  | 0.01  | 0          | 0.05    | 2     | training-bound       |
| slow_transfer | 0.01  | 0.06       | 0.01    | 2     | data-transfer-bound  |
| balanced      | 0.2   | 0          | 0.1     | 3     | balanced             |

Balanced: two actors supply 10 results/s of generate time, the trainer takes ~9/s (a step is
~0.11 s with its own overhead), so the actors are ~90% busy, and the six results in flight
keep the pool from running dry when a step or a call is late.
Prints one `SCENARIO {...}` line per mode: its run id and, per step, the carriers it consumed.
"""

import json
import os
import time

import ray

import otel_train
import otel_train.ray as otr

#: mode -> (GEN_S, TRANSFER_S, TRAIN_S, DEPTH)
MODES = {"slow_actors": (0.1, 0.0, 0.01, 2), "slow_trainer": (0.01, 0.0, 0.05, 2),
         "slow_transfer": (0.01, 0.06, 0.01, 2), "balanced": (0.2, 0.0, 0.1, 3)}
STEPS = int(os.environ.get("STEPS", "16"))
BATCH = 4


@ray.remote(num_cpus=0)
class Generator:
    def __init__(self, gen_s: float, transfer_s: float) -> None:
        self.gen_s, self.transfer_s = gen_s, transfer_s

    def generate(self, i: int) -> otr.Traced:
        result = self._generate(i)
        time.sleep(self.transfer_s)  # the result on its way, outside the generate span
        return result

    @otr.generate(batch_size=BATCH)
    def _generate(self, i: int) -> list[int]:
        time.sleep(self.gen_s)
        return [i] * BATCH


def run(mode: str, prefix: str) -> dict:
    gen_s, transfer_s, train_s, depth = MODES[mode]
    run_id = f"{prefix}-{mode}"
    otel_train.init(run_id=run_id)
    env = otr.runtime_env()
    actors = [Generator.options(runtime_env=env).remote(gen_s, transfer_s) for _ in range(2)]
    owner = {}
    for actor in actors:
        for i in range(depth):
            owner[actor.generate.remote(i)] = actor
    pending = list(owner)
    ray.wait(pending, num_returns=len(pending))  # the pool filled before training starts
    consumed = []
    for step in range(STEPS):
        with otel_train.step(step):
            ready, pending = otr.wait(pending, num_returns=1)
            carriers = []
            for ref, value in ready.items():
                actor = owner.pop(ref)
                new = actor.generate.remote(step)
                owner[new] = actor
                pending.append(new)
                assert value == [value[0]] * BATCH
            consumed.append(sorted(r.carrier["traceparent"] for r in ray.get(list(ready))))
            with otel_train.span("train.forward"):
                time.sleep(train_s)
    ray.get(pending)  # let the calls in flight finish (their spans end), outside any step
    otr.flush(*actors)
    otel_train.shutdown()
    return {"mode": mode, "run_id": run_id, "consumed": consumed}


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        for mode in os.environ.get("MODES", ",".join(MODES)).split(","):
            print("SCENARIO " + json.dumps(run(mode, os.environ.get("RUN_PREFIX", "pipe"))), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
