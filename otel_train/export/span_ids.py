"""The span and trace ids of one run and rank, as the assembler and its fast path need them.

The rules themselves (derived from run id and step, or from the process's salt and a region's
sequence number) are in `otel_train.wire.ids`; this caches what a run repeats.
"""

from __future__ import annotations

from otel_train._distributed import RunInfo
from otel_train.wire.ids import StepIds, region_span_id, step_span_id, trace_id_for

_CACHE_MAX = 4096  # steps remembered; cleared past this


class SpanIds:
    """Trace id per step, step span ids (this rank's and rank 0's), region span ids."""

    def __init__(self, run: RunInfo, salt: int) -> None:
        self.run = run
        self.salt = salt
        #: The ids' bytes as they go on the wire (the fast path's form).
        self.step_bytes = StepIds(run.run_id, run.rank, run.restart, run.launch)
        self._trace_ids: dict[int | None, int] = {}
        self._step_ids: dict[int, int] = {}

    def trace(self, step_n: int | None) -> int:
        """The trace of step `step_n` (None: before the first step)."""
        trace_id = self._trace_ids.get(step_n)
        if trace_id is None:
            if len(self._trace_ids) > _CACHE_MAX:
                self._trace_ids.clear()
            trace_id = self._trace_ids[step_n] = trace_id_for(self.run.run_id, step_n)
        return trace_id

    def step_span(self, step_n: int) -> int:
        """This rank's `train.step` span of step `step_n`."""
        cached = self._step_ids.get(step_n)
        if cached is None:
            if len(self._step_ids) > _CACHE_MAX:
                self._step_ids.clear()
            run = self.run
            cached = self._step_ids[step_n] = step_span_id(run.run_id, step_n, run.rank, run.restart, run.launch)
        return cached

    def root_step(self, step_n: int) -> int | None:
        """The parent of this rank's step span: rank 0's step span (None on rank 0)."""
        run = self.run
        return None if run.rank == 0 else step_span_id(run.run_id, step_n, 0, run.restart, run.launch)

    def region(self, seq: int) -> int:
        """The span id of this process's `seq`-th region."""
        return region_span_id(self.salt, seq)
