"""Counts every collective a torchrun rank issues through torch.distributed, from interpreter
start (before otel_train or the script run) to exit. Put this directory on PYTHONPATH.

The count is taken at the lowest layer Python reaches, `ProcessGroup`'s methods, so calls from
the script, from DDP's Python comm hook and from any library (otel_train included) are all
seen. At exit each rank writes `{COUNT_COLLECTIVES_DIR}/collectives-rank<R>.json`: method ->
calls. Only in processes torchrun started (RANK set); never in otel_train's exporter process.
"""

import atexit
import json
import os
from collections import Counter

if os.environ.get("RANK") is not None and os.environ.get("COUNT_COLLECTIVES_DIR") \
        and os.environ.get("OTEL_TRAIN_EXPORTER_CHILD") != "1":
    from torch._C._distributed_c10d import ProcessGroup

    _calls: Counter = Counter()
    _METHODS = ("allreduce", "allreduce_coalesced", "broadcast", "barrier", "monitored_barrier", "allgather",
                "allgather_coalesced", "allgather_into_tensor_coalesced", "_allgather_base", "all_gather_single",
                "reduce", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced",
                "alltoall", "alltoall_base", "gather", "scatter", "send", "recv", "recv_anysource")

    def _counted(name, original):
        def method(self, *args, **kwargs):
            _calls[name] += 1
            return original(self, *args, **kwargs)
        return method

    for _name in _METHODS:
        if hasattr(ProcessGroup, _name):
            setattr(ProcessGroup, _name, _counted(_name, getattr(ProcessGroup, _name)))

    def _write() -> None:
        path = os.path.join(os.environ["COUNT_COLLECTIVES_DIR"], f"collectives-rank{os.environ['RANK']}.json")
        with open(path, "w") as f:
            json.dump(dict(_calls), f)

    atexit.register(_write)
