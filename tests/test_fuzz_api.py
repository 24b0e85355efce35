"""Fuzzing the public API and the settings (issue 53): whatever a training loop hands us, the
loop finishes, nothing of ours raises into it, and the closing line counts what the receiver got.

Two parts, each against the suite's real OTLP receiver in a real subprocess:

- `PROGRAMS`: hypothesis draws programs of API calls (spans with hostile names and attributes,
  nested, re-entered, exited twice or out of order; steps with odd numbers; tags, events,
  links with odd carriers; decorators; inject) and runs each inside one instrumented process.
  A bounded count, derandomized: the same programs every run, so a failure reproduces.
- settings: seeded draws of hostile values for every setting that does not change where spans
  go (numbers out of range, text where a number goes, control characters, half-set mutual
  TLS, bad headers), each run as a plain loop that must deliver every span.
"""

from __future__ import annotations

import random

import pytest
from support.fault_run import TrainingRun, run_script, settle
from support.otlp_receiver import OTLPReceiver

PROGRAMS = 60  # programs a CI run tries; each is a few hundred calls at most


FUZZ = """
    import asyncio, sys, traceback
    from hypothesis import HealthCheck, given, settings, strategies as st
    import otel_train

    class Hostile:
        def __str__(self):
            raise RuntimeError("str")
        __repr__ = __str__
        def __eq__(self, other):
            raise RuntimeError("eq")
        __hash__ = object.__hash__

    class Weird(float):
        pass

    names = st.one_of(st.text(max_size=40), st.sampled_from(["train.forward", "train.data", ""]),
                      st.integers(), st.none(), st.builds(Hostile))
    values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                       st.text(max_size=300), st.binary(max_size=20), st.builds(Hostile),
                       st.builds(Weird, st.floats()), st.lists(st.integers(), max_size=5),
                       st.lists(st.one_of(st.integers(), st.text(max_size=5)), max_size=5),
                       st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
                       st.integers(min_value=2**63, max_value=2**70))
    attrs = st.dictionaries(st.text(min_size=1, max_size=20).filter(lambda k: k != "device_time"), values,
                            max_size=4)
    carriers = st.one_of(st.none(), st.integers(), st.text(max_size=60), st.builds(Hostile),
                         st.dictionaries(st.text(max_size=12), st.text(max_size=60), max_size=2),
                         st.just({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}),
                         st.lists(st.one_of(st.integers(), st.text(max_size=10)), max_size=3))
    step_numbers = st.one_of(st.none(), st.integers(min_value=-5, max_value=2**65), st.text(max_size=4),
                             st.floats(allow_nan=True))
    op = st.one_of(
        st.tuples(st.just("span"), names, attrs, st.integers(0, 3)),
        st.tuples(st.just("reenter"), names),
        st.tuples(st.just("misorder"), names, names),
        st.tuples(st.just("exit_twice"), names),
        st.tuples(st.just("enter_only"), names),
        st.tuples(st.just("step"), step_numbers, st.integers(0, 3)),
        st.tuples(st.just("step_open"), step_numbers),
        st.tuples(st.just("tag"), names),
        st.tuples(st.just("event"), st.text(max_size=10), attrs),
        st.tuples(st.just("link"), carriers),
        st.tuples(st.just("inject")),
        st.tuples(st.just("decorated"), names, attrs),
        st.tuples(st.just("async"), names),
        st.tuples(st.just("raises"), names),
    )

    def leaf(depth):
        with otel_train.span("fuzz.leaf"):
            if depth:
                leaf(depth - 1)

    def run(one):
        kind = one[0]
        if kind == "span":
            with otel_train.span(one[1], **one[2]):
                leaf(one[3])
        elif kind == "reenter":
            sp = otel_train.span(one[1])
            with sp:
                with sp:
                    leaf(1)
        elif kind == "misorder":
            a, b = otel_train.span(one[1]), otel_train.span(one[2])
            a.__enter__(); b.__enter__(); a.__exit__(None, None, None); b.__exit__(None, None, None)
        elif kind == "exit_twice":
            sp = otel_train.span(one[1])
            sp.__enter__(); sp.__exit__(None, None, None); sp.__exit__(None, None, None)
        elif kind == "enter_only":
            otel_train.span(one[1]).__enter__()
        elif kind == "step":
            with otel_train.step(one[1]):
                leaf(one[2])
        elif kind == "step_open":
            otel_train.step(one[1]).__enter__()
        elif kind == "tag":
            otel_train.tag(one[1])
        elif kind == "event":
            otel_train.event(one[1], **one[2])
        elif kind == "link":
            otel_train.link(one[1])
        elif kind == "inject":
            otel_train.inject()
        elif kind == "decorated":
            otel_train.span(one[1], **one[2])(lambda: leaf(0))()
        elif kind == "async":
            async def body():
                async with otel_train.span(one[1]):
                    await asyncio.sleep(0)
            asyncio.run(body())
        elif kind == "raises":
            try:
                with otel_train.span(one[1]):
                    raise ValueError("the user's own error")
            except ValueError:
                pass

    otel_train.init()
    failures = []

    @settings(max_examples=int(sys.argv[1]), deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(op, max_size=25))
    def program(ops):
        for one in ops:
            try:
                run(one)
            except Exception:
                failures.append((one[0], traceback.format_exc(limit=3)))

    program()
    print("FAILURES", len(failures), flush=True)
    for kind, text in failures[:3]:
        print(kind, text, flush=True)
"""


def test_random_api_programs_never_raise_into_the_loop_and_the_counts_hold(receiver: OTLPReceiver) -> None:
    """Hypothesis's programs in one instrumented process: none of our calls raises into the
    program (the user's own ValueError is theirs and is caught there), the process exits 0, and
    the closing line's exported count is exactly what the receiver holds for the run."""
    result = run_script(FUZZ, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_TRAIN_RUN_ID": "fuzz",
                               "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "30"}, timeout=300, args=(str(PROGRAMS),))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FAILURES 0" in result.stdout, result.stdout[-3000:]
    assert "Traceback" not in result.stderr and "Logging error" not in result.stderr, result.stderr[-3000:]
    spans = settle(receiver, "fuzz", quiet_s=1.0)
    assert result.exported is not None and result.exported == len(spans) > 0, (result.exported, len(spans))
    assert result.dropped == 0, result.stderr[-2000:]


#: Hostile values for settings that leave the destination as it is; each draw also gets a bad
#: header and, now and then, half of a mutual-TLS pair.
_BAD = ["", " ", "-1", "0", "1e10", "1e300", "inf", "nan", "abc", "\x00", "1\n2", "9" * 40, "0x10", "true"]
_SETTINGS = ["OTEL_TRAIN_BUFFER_SIZE", "OTEL_TRAIN_FLUSH_INTERVAL_MS", "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S",
             "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_EXPORTER_OTLP_TIMEOUT",
             "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_METRIC_EXPORT_INTERVAL", "OTEL_TRAIN_STEP_SAMPLE",
             "OTEL_TRAIN_DEVICE_TIMING", "OTEL_TRAIN_EXPORT_MODE", "OTEL_TRAIN_EXPORTER_PRIORITY",
             "OTEL_TRAIN_CONSOLE_EVERY", "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_SERVICE_NAME",
             "OTEL_TRAIN_FLOPS_PER_STEP", "OTEL_TRAIN_PEAK_FLOPS", "OTEL_TRAIN_ROLE"]
_HEADERS = ["a=b%0Ac", "=x", "k", "authorization=Bearer%20tok-fuzz%0D", "x-bin=%FF", "Key With Space=1", ",,,"]
_GOOD = {"OTEL_TRAIN_EXPORT_MODE": "thread", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
         "OTEL_TRAIN_BUFFER_SIZE": "64", "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "20"}


@pytest.mark.parametrize("seed", range(6))
def test_random_hostile_settings_never_stop_a_run_and_the_counts_hold(receiver: OTLPReceiver, seed: int,
                                                                       tmp_path) -> None:
    """Seeded draws of hostile settings (`_BAD` for a handful of `_SETTINGS`, a bad header, a half
    mutual-TLS pair): the run exits 0, prints no traceback and no secret, and its closing line
    counts exactly what the receiver got, the rest as dropped."""
    rng = random.Random(seed)
    env = {name: rng.choice(_BAD) for name in rng.sample(_SETTINGS, 6)}
    env.update(rng.sample(sorted(_GOOD.items()), 2))
    env["OTEL_EXPORTER_OTLP_HEADERS"] = ",".join(rng.sample(_HEADERS, 3)) + ",x-fuzz=ok"
    if rng.random() < 0.5:
        key = tmp_path / "client.key"
        key.write_text("not a key\n")
        env["OTEL_EXPORTER_OTLP_CLIENT_KEY"] = str(key)
    env = {k: v for k, v in env.items() if "\x00" not in v}  # an environment cannot hold NUL
    run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, **env}, 30)
    result = run.finish()
    spans = settle(receiver, run.run_id)
    assert result.returncode == 0, (env, result.stderr)
    assert "Traceback" not in result.stderr and "Logging error" not in result.stderr, (env, result.stderr)
    assert "tok-fuzz" not in result.stderr
    assert result.exported is not None and result.exported == len(spans), (env, result.stderr, len(spans))
    assert result.exported + result.dropped == 30 * 5, (env, result.stderr)
