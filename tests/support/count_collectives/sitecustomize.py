"""What the torchrun tests do to each rank from interpreter start. Put this directory on PYTHONPATH.

`TESTS_CLOCK_OFFSET_NS` ("R=N,R=N", ns by rank): the rank's wall clock (`time.time_ns`,
`time.time`) is shifted, as on a host whose clock is off, in its exporter process too (which
inherits the environment); the monotonic clock stays the real one. Test-side on purpose: the
package reads no test-only variable.

Counts every collective a torchrun rank issues through torch.distributed, from interpreter
start (before otel_train or the script run) to exit.

The count is taken at the lowest layer Python reaches, `ProcessGroup`'s methods, so calls from
the script, from DDP's Python comm hook and from any library (otel_train included) are all
seen. At exit each rank writes `{COUNT_COLLECTIVES_DIR}/collectives-rank<R>.json`: method ->
calls. Only in processes torchrun started (RANK set); never in otel_train's exporter process.
"""

import atexit
import json
import os
import time
from collections import Counter

_SHIFTS = os.environ.get("TESTS_CLOCK_OFFSET_NS")
if os.environ.get("RANK") is not None and _SHIFTS:
    _shift_ns = int(dict(part.split("=", 1) for part in _SHIFTS.split(",")).get(os.environ["RANK"], "0"))
    if _shift_ns:
        _real_time_ns, _real_time = time.time_ns, time.time
        time.time_ns = lambda: _real_time_ns() + _shift_ns
        time.time = lambda: _real_time() + _shift_ns / 1e9

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
