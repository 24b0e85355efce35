"""Inference actors and the trainer they feed (the TorchSpec seed's pipeline).

An actor is a process with `ml.role=inference` (`OTEL_TRAIN_ROLE=inference`, or
`otel_train.init(role="inference")`) that generates samples for a trainer. Each generate call
is an `infer.generate` span in a trace of its own; the carrier it hands out rides along with
its samples over any transport (a queue, Ray object refs, RPC), and the trainer's step that
consumes them links to it:

    # actor
    with otel_train.inference.generate(batch_size=len(prompts)) as call:
        samples = model.generate(prompts)
        call.samples = len(samples)                   # infer.samples (capacity = samples / s busy)
    queue.put((samples, call.carrier))                # call.carrier is otel_train.inject() inside it

    # trainer
    with otel_train.step():
        with otel_train.inference.dispatch_wait(pool_size=queue.qsize()) as wait:
            samples, carrier = queue.get()
            wait.consumed(carrier, len(samples))      # link this step to the producer's span
        ...

`generate` is also a decorator (`@otel_train.inference.generate()`: `infer.samples` is the
result's length when it has one). Ray actors: `otel_train.ray`. What the exporter makes of
these spans (`infer.batch.duration`, `infer.capacity`, `pipeline.dispatch_wait`,
`pipeline.pool.size`, `train.capacity`, `pipeline.throughput`) and the verdict `diagnose` gives:
docs/actors.md.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any, TypeVar

import otel_train
from otel_train import semconv

__all__ = ["generate", "dispatch_wait"]

_F = TypeVar("_F")


class _Spanned:
    """A span of a fixed name whose attributes may still be set while it is open."""

    name = ""

    def __init__(self, attrs: dict[str, Any]) -> None:
        self._attrs = attrs
        self._region: Any = None

    def _set(self, key: str, value: Any) -> None:
        self._attrs[key] = value
        region = self._region
        if region is not None:
            try:
                if region.attrs is None:
                    region.attrs = {}
                region.attrs[key] = value
            except AttributeError:  # the disabled no-op span
                pass

    def __enter__(self) -> Any:
        self._region = otel_train.span(self.name, **self._attrs)
        self._region.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        region, self._region = self._region, None
        region.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> Any:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


class generate(_Spanned):  # noqa: N801 - used like a function: `with generate(...)`, `@generate()`
    """One generate call of an inference actor: an `infer.generate` span.

    `batch_size` (`infer.batch_size`): prompts in; `samples` (`infer.samples`): samples out, also
    settable inside the block (`call.samples = n`). `carrier` inside the block: the W3C trace
    context to send with the samples (`otel_train.inject()`)."""

    name = semconv.SPAN_INFER_GENERATE

    def __init__(self, batch_size: int | None = None, *, samples: int | None = None, **attrs: Any) -> None:
        if batch_size is not None:
            attrs[semconv.INFER_BATCH_SIZE] = batch_size
        if samples is not None:
            attrs[semconv.INFER_SAMPLES] = samples
        super().__init__(attrs)
        self.carrier: dict[str, str] = {}

    def __enter__(self) -> generate:
        super().__enter__()
        self.carrier = otel_train.inject()
        return self

    @property
    def samples(self) -> int | None:
        return self._attrs.get(semconv.INFER_SAMPLES)

    @samples.setter
    def samples(self, n: int) -> None:
        self._set(semconv.INFER_SAMPLES, n)

    def __call__(self, fn: _F) -> _F:
        """`@generate(...)`: each call of `fn` (sync or async) is one generate call; its result's
        length is `infer.samples` unless given."""
        attrs = dict(self._attrs)

        def counted(call: generate, result: Any) -> Any:
            if call.samples is None and hasattr(result, "__len__"):
                try:
                    call.samples = len(result)
                except TypeError:
                    pass
            return result

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)  # type: ignore[arg-type]
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with generate(**attrs) as call:
                    return counted(call, await fn(*args, **kwargs))  # type: ignore[operator]
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)  # type: ignore[arg-type]
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with generate(**attrs) as call:
                return counted(call, fn(*args, **kwargs))  # type: ignore[operator]
        return wrapper  # type: ignore[return-value]


class dispatch_wait(_Spanned):  # noqa: N801 - used like a function: `with dispatch_wait(...)`
    """The trainer waiting for samples from its actors: a `pipeline.dispatch_wait` span.

    `pool_size` (`pipeline.pool.size`): samples ready in the trainer's pool (settable inside the
    block). `consumed(carrier, n)` for each batch taken: links the current step to the span that
    produced it and counts `n` samples (`pipeline.samples`)."""

    name = semconv.SPAN_DISPATCH_WAIT

    def __init__(self, pool_size: int | None = None, **attrs: Any) -> None:
        if pool_size is not None:
            attrs[semconv.PIPELINE_POOL_SIZE] = pool_size
        super().__init__(attrs)

    @property
    def pool_size(self) -> int | None:
        return self._attrs.get(semconv.PIPELINE_POOL_SIZE)

    @pool_size.setter
    def pool_size(self, n: int) -> None:
        self._set(semconv.PIPELINE_POOL_SIZE, n)

    def consumed(self, carrier: Mapping[str, str] | str | None, samples: int = 1) -> None:
        if carrier:
            otel_train.link(carrier)
        self._set(semconv.PIPELINE_SAMPLES, self._attrs.get(semconv.PIPELINE_SAMPLES, 0) + samples)
