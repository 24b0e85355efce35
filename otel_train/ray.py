"""Ray actors as inference actors: their calls traced, their results carrying the carrier.

Explicit propagation, not Ray's built-in tracing: a decorated actor method runs inside a span
(`infer.generate` by default) and returns `Traced(value, carrier)`; the trainer's
`otel_train.ray.get(refs)` waits for them inside a `pipeline.dispatch_wait` span, links its
current step to each producer span and hands back the plain values. Each actor process
initialises otel_train itself, as `ml.role=inference` of the driver's run:

    import ray
    import otel_train
    import otel_train.ray as otr

    ray.init(runtime_env=otr.runtime_env())      # actors join this run (its id, exporter, output dir)

    @ray.remote
    class Generator:
        @otr.generate()                          # an infer.generate span; infer.samples = len(result)
        def generate(self, prompts):
            return model.generate(prompts)

    actors = [Generator.remote() for _ in range(4)]
    for step in range(steps):
        with otel_train.step():
            batch = otr.get([a.generate.remote(p) for a, p in zip(actors, prompts)])
            train_on(batch)

Results that travel another way (a queue, `ray.wait` then `ray.get` of your own) are unwrapped
with `otr.consume(result)`, which links too. `otr.traced("my.span")` traces a method under
another name. Flush an actor before killing it with `otr.flush(actor)`; its own exit (or
`ray.shutdown()`, which ends actors with SIGTERM) flushes as any process's does.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import otel_train
from otel_train import _runtime, inference, semconv

__all__ = ["Traced", "ActorMixin", "runtime_env", "generate", "traced", "get", "wait", "consume", "flush"]

_F = TypeVar("_F", bound=Callable[..., Any])
#: Settings an actor takes from the driver, passed in their variables (`Config.as_environment`).
_PASSED = ("run_id", "output_dir", "service_name", "traces_exporter", "metrics_exporter", "endpoint",
           "metrics_endpoint", "protocol", "headers", "disabled")


@dataclass
class Traced:
    """An actor method's result and the W3C trace context of the span that produced it."""

    value: Any
    carrier: dict[str, str] = field(default_factory=dict)
    samples: int = 1


def runtime_env(base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A Ray `runtime_env` (for `ray.init(runtime_env=...)` or `.options(runtime_env=...)`) whose
    processes join this driver's run as inference actors: its run id, exporter settings and
    output directory (absolute), `OTEL_TRAIN_ROLE=inference`; `base`'s entries are kept."""
    run = otel_train.init()
    env = dict(base or {})
    env_vars = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    st = _runtime.state()
    if st is not None:
        env_vars.update(st.cfg.as_environment(_PASSED))
        env_vars[semconv.ENV_OUTPUT_DIR] = os.path.abspath(st.cfg.output_dir)  # the actor's cwd is not ours
    if run is not None:
        env_vars[semconv.ENV_RUN_ID] = run.run_id
    env_vars[semconv.ENV_ROLE] = semconv.ROLE_INFERENCE
    env_vars[semconv.ENV_EXPORT_MODE] = _ACTOR_EXPORT_MODE
    env_vars.update(env.get("env_vars") or {})
    env["env_vars"] = env_vars
    return env


#: Ray ends a worker's child processes when the worker exits, before its exit hooks run, so an
#: actor's exporter process would die with its last spans unexported: actors export from a
#: thread (a few spans a second; the exporter process is for a trainer's thousands).
_ACTOR_EXPORT_MODE = "thread"


def _as_actor() -> None:
    """Initialise this process as an inference actor, unless it already is initialised."""
    otel_train.init(role=semconv.ROLE_INFERENCE, export_mode=_ACTOR_EXPORT_MODE)


def traced(name: str = semconv.SPAN_INFER_GENERATE, **attrs: Any) -> Callable[[_F], _F]:
    """Decorate an actor method: each call runs in a span `name` and returns `Traced(result,
    carrier)`. With `infer.generate`, `infer.samples` is the result's length when it has one."""

    def decorate(fn: _F) -> _F:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Traced:
                _as_actor()
                async with _span(name, attrs) as call:
                    return _wrap(call, await fn(*args, **kwargs))
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Traced:
            _as_actor()
            with _span(name, attrs) as call:
                return _wrap(call, fn(*args, **kwargs))
        return wrapper  # type: ignore[return-value]

    return decorate


def generate(batch_size: int | None = None, **attrs: Any) -> Callable[[_F], _F]:
    """`traced("infer.generate")`, with `infer.batch_size` when given."""
    if batch_size is not None:
        attrs[semconv.INFER_BATCH_SIZE] = batch_size
    return traced(semconv.SPAN_INFER_GENERATE, **attrs)


class _Named(inference._Spanned):
    def __init__(self, name: str, attrs: dict[str, Any]) -> None:
        self.name = name
        super().__init__(attrs)
        self.carrier: dict[str, str] = {}

    def __enter__(self) -> _Named:
        super().__enter__()
        self.carrier = otel_train.inject()
        return self


def _span(name: str, attrs: Mapping[str, Any]) -> Any:
    if name == semconv.SPAN_INFER_GENERATE:
        return inference.generate(**attrs)
    return _Named(name, dict(attrs))


def _wrap(call: Any, value: Any) -> Traced:
    samples = _length(value)
    if isinstance(call, inference.generate):
        if call.samples is None and samples is not None:
            call.samples = samples
        samples = call.samples if call.samples is not None else samples
    return Traced(value, call.carrier, samples if samples is not None else 1)


def _length(value: Any) -> int | None:
    try:
        return len(value) if hasattr(value, "__len__") else None
    except TypeError:
        return None


def consume(result: Any) -> Any:
    """The value of an actor's result, linking the current step to the span that produced it
    (a result that is not `Traced` comes back as it is)."""
    if isinstance(result, Traced):
        otel_train.link(result.carrier)
        return result.value
    return result


def get(refs: Any, *, timeout: float | None = None, pool_size: int | None = None) -> Any:
    """`ray.get(refs)` inside a `pipeline.dispatch_wait` span: each `Traced` result linked to the
    current step, its samples counted (`pipeline.samples`), its value returned (a list for a
    list of refs, a value for one ref)."""
    import ray

    with inference.dispatch_wait(pool_size=pool_size) as wait:
        results = ray.get(refs, timeout=timeout)
        single = not isinstance(results, list)
        values = []
        for result in [results] if single else results:
            if isinstance(result, Traced):
                wait.consumed(result.carrier, result.samples)
                values.append(result.value)
            else:
                values.append(result)
    return values[0] if single else values


def wait(refs: list[Any], *, num_returns: int = 1, timeout: float | None = None) -> tuple[dict[Any, Any], list[Any]]:
    """`ray.wait` on a pool of pending results, then their values, inside a
    `pipeline.dispatch_wait` span: returns ({ready ref: its value}, the refs still pending), so
    the caller knows which actor to ask again. Each result is linked and counted as in `get`;
    `pipeline.pool.size` is how many results were ready already when the wait began (0: the
    trainer is starved)."""
    import ray

    ready_now, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
    with inference.dispatch_wait(pool_size=len(ready_now)) as span:
        ready, pending = ray.wait(refs, num_returns=num_returns, timeout=timeout)
        values = {}
        for ref, result in zip(ready, ray.get(ready)):
            if isinstance(result, Traced):
                span.consumed(result.carrier, result.samples)
                result = result.value
            values[ref] = result
    return values, pending


def flush(*actors: Any, timeout: float | None = None) -> None:
    """Flush and stop otel_train in each actor (a remote call to `_otel_train_flush` where the
    class has `ActorMixin`; a plain actor: ends it gracefully, `__ray_terminate__`, which
    runs its exit hooks)."""
    import ray

    refs = []
    for actor in actors:
        method = getattr(actor, "_otel_train_flush", None)
        refs.append(method.remote(timeout) if method is not None else actor.__ray_terminate__.remote())
    try:
        ray.get(refs, timeout=timeout)
    except Exception:  # noqa: BLE001 - a terminated actor's call may report its own exit
        pass


class ActorMixin:
    """Optional base for an actor class: `_otel_train_flush` (what `flush` calls), and
    initialisation as an inference actor when the actor is created, not at its first traced call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _as_actor()
        super().__init__(*args, **kwargs)

    def _otel_train_flush(self, timeout: float | None = None) -> None:
        otel_train.shutdown(timeout)
