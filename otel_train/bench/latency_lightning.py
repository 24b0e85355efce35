"""`TrainingLatencyCallback`: forward and forward+backward latency, measured once during a Lightning fit.

    from otel_train.lightning import TrainingLatencyCallback
    trainer = Trainer(callbacks=[TrainingLatencyCallback(start_step=500, warmup=10, iters=50)])

At the end of the first training batch whose optimizer step brings `trainer.global_step` to
`start_step` or beyond (never mid-accumulation: only after a batch that stepped), between two
training steps, the callback times `iters` synthetic batches of each phase after `warmup`
untimed ones (`latency.measure_latency`). Synthetic batches copy the structure, shapes and
dtypes of that training batch (`synthetic.SyntheticBatches.like`); the data loader is never
read. The forward runs in the trainer's precision context (autocast for mixed precision).

Training is not changed: the model's modes, gradients (an accumulation in progress survives),
buffers (BatchNorm statistics) and the torch RNG states are restored, no optimizer is touched,
and the trained weights come out bit-identical to a run without the callback (tested).

Ranks: every rank measures its own replica, between two barriers the callback places itself,
outside the step (after the step's update, before the next batch is fetched). The trigger is
`global_step`, the same on every rank, so all ranks reach both barriers; the module is called
directly, not through DDP's wrapper, so the measurement holds no gradient all-reduce, and a
collective inside the model (SyncBatchNorm) runs on all ranks together. Measuring on rank 0
alone would deadlock such a model, and would leave the other ranks' hardware unmeasured.

Results: the table on rank 0's stdout (its own numbers); every rank's result as JSON
(`save_path`, default `<default_root_dir>/latency/latency-rank<R>.json`); the metrics to the
trainer's loggers (`bench/forward_latency_mean_s`, ...; Lightning loggers write on rank 0);
spans and metrics as `otel-train bench latency` emits them (docs/bench-latency.md),
`bench.latency` carrying `bench.after_step` (the global step it follows). A benchmark that fails (a
module without `forward`: pass `forward_fn`) logs a warning and training goes on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from otel_train import semconv
from otel_train.bench import latency, latency_report
from otel_train.bench.synthetic import SyntheticBatches
from otel_train.detect.integrations import outside_training

__all__ = ["TrainingLatencyCallback"]

_log = logging.getLogger("otel_train")


def _training_inputs(module: torch.nn.Module, batch: Any) -> Any:
    """The default forward: the inputs of a training batch are the batch itself (a tensor or a
    dict of keyword inputs) or, in a tuple / list, its first item (the (inputs, targets) convention)."""
    if isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    return latency.call_with(module, batch)


class TrainingLatencyCallback(pl.Callback):
    """Measure forward and forward+backward latency on synthetic batches once, at `start_step`."""

    def __init__(self, start_step: int = 500, warmup: int = 10, iters: int = 50, *,
                 batch_size: int | None = None, seq_len: int | None = None, vocab_size: int | None = None,
                 forward_fn: Callable[[pl.LightningModule, Any], Any] | None = None,
                 save_path: str | os.PathLike[str] | None = None, print_table: bool = True,
                 log_metrics: bool = True, enabled: bool = True) -> None:
        """
        Args:
            start_step: measure after the first optimizer step that reaches this global step.
            warmup: untimed synthetic batches per phase before the timed ones.
            iters: timed synthetic batches per phase.
            batch_size, seq_len: resize the synthetic batches (dim 0; dim 1 of token tensors).
            vocab_size: integer inputs drawn below it (default: within the training batch's range).
            forward_fn: `forward_fn(pl_module, batch) -> output` (default: `pl_module(inputs)`, the
                inputs being the batch or its first item); backward runs from the output's `loss`,
                else from the mean of its first floating tensor.
            save_path: the JSON result; with several ranks, `-rank<R>` is added before the suffix.
            print_table: print the table (rank 0).
            log_metrics: send mean/std latency and throughput to the trainer's loggers.
            enabled: False makes the callback do nothing.
        """
        super().__init__()
        for name, value, minimum in (("start_step", start_step, 0), ("warmup", warmup, 0), ("iters", iters, 1),
                                     ("batch_size", batch_size, 1), ("seq_len", seq_len, 1),
                                     ("vocab_size", vocab_size, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
                raise ValueError(f"TrainingLatencyCallback({name}={value!r}): expected an integer >= {minimum}")
        self.start_step, self.warmup, self.iters = start_step, warmup, iters
        self.batch_size, self.seq_len, self.vocab_size = batch_size, seq_len, vocab_size
        self.forward_fn = forward_fn or _training_inputs
        self.save_path = save_path
        self.print_table, self.log_metrics, self.enabled = print_table, log_metrics, enabled
        #: The result dict (`latency.measure_latency`) once measured; None before, or if it failed.
        self.result: dict[str, Any] | None = None
        self._done = False
        self._last_step: int | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._done or not self.enabled:
            return
        stepped = trainer.global_step != self._last_step
        self._last_step = trainer.global_step
        # The same decision on every rank (global_step is), so every rank reaches the barriers.
        if not stepped or trainer.global_step < self.start_step:
            return
        self._done = True
        self.result = self._measure(trainer, pl_module, batch)
        if self.result is not None:
            self._report(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.enabled and not self._done and trainer.is_global_zero:
            _log.warning("otel_train: TrainingLatencyCallback: training ended at step %d, before start_step=%d; "
                         "no latency was measured", trainer.global_step, self.start_step)

    def _measure(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> dict[str, Any] | None:
        device = pl_module.device
        precision = getattr(trainer, "precision_plugin", None)
        reached: list[str] = []

        def barrier(which: str) -> None:
            reached.append(which)
            trainer.strategy.barrier(f"otel_train.bench.latency.{which}")

        result = None
        # Every rank reaches both barriers, whatever fails; they stand outside the step (a rank
        # waiting for a slower one is benchmark time, inside `bench.latency`, not step time).
        with outside_training():
            try:
                batches = SyntheticBatches.like(batch, batch_size=self.batch_size, seq_len=self.seq_len,
                                                vocab_size=self.vocab_size, device=device)
                result = latency.measure_latency(
                    pl_module, batches, warmup=self.warmup, iters=self.iters, device=device,
                    forward_fn=self.forward_fn, context=getattr(precision, "forward_context", None), sync=barrier,
                    span_attrs={latency.ATTR_MODEL: type(pl_module).__qualname__,
                                semconv.BENCH_AFTER_STEP: trainer.global_step},
                    extra={"model": type(pl_module).__qualname__, "start_step": self.start_step,
                           "measured_after_step": trainer.global_step, "rank": trainer.global_rank,
                           "world_size": trainer.world_size})
            except Exception as err:  # noqa: BLE001 - a benchmark must never stop training
                _log.warning("otel_train: TrainingLatencyCallback: the latency benchmark failed on rank %d (%s: %s); "
                             "training goes on%s", trainer.global_rank, type(err).__name__, err,
                             "" if self.forward_fn is not _training_inputs else
                             " (if the module has no usable forward, pass forward_fn=)")
            finally:
                for which in ("start", "end"):
                    if which not in reached:
                        barrier(which)
        return result

    def _report(self, trainer: pl.Trainer) -> None:
        result = self.result
        assert result is not None
        try:
            path = latency_report.write_json(result, self._json_path(trainer))
            if self.print_table and trainer.is_global_zero:
                print(latency_report.format_table(result, f"{result['model']} after step "
                                                          f"{result['measured_after_step']}"))
                print(f"json: {path}" + (" (one file per rank)" if trainer.world_size > 1 else ""), flush=True)
            if self.log_metrics:
                for logger in trainer.loggers:
                    logger.log_metrics(_logger_metrics(result), step=trainer.global_step)
        except Exception as err:  # noqa: BLE001 - reporting must never stop training either
            _log.warning("otel_train: TrainingLatencyCallback: reporting the latency failed (%s: %s)",
                         type(err).__name__, err)

    def _json_path(self, trainer: pl.Trainer) -> Path:
        rank = trainer.global_rank
        if self.save_path is None:
            return Path(trainer.default_root_dir) / "latency" / f"latency-rank{rank}.json"
        path = Path(self.save_path)
        return path.with_name(f"{path.stem}-rank{rank}{path.suffix}") if trainer.world_size > 1 else path


def _logger_metrics(result: dict[str, Any]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for phase, res in result["phases"].items():
        metrics[f"bench/{phase}_latency_mean_s"] = res["latency_s"]["mean"]
        metrics[f"bench/{phase}_latency_std_s"] = res["latency_s"]["std"]
        for key in ("tokens_per_s", "samples_per_s"):
            if res.get(key) is not None:
                metrics[f"bench/{phase}_{key}"] = res[key]
    return metrics
