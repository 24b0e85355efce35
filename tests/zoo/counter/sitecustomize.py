"""The zoo's independent witness: counts optimizer steps in every Python process of a zoo run.

This directory goes on PYTHONPATH for zoo runs only (plain and instrumented alike), so Python
imports this module at start-up, before the script and before otel_train. It does nothing
unless ZOO_COUNT_DIR is set. It owes nothing to otel_train: it counts with torch's own global
optimizer hook (`torch.optim.optimizer.register_optimizer_step_post_hook`), registered the
moment torch defines it, without importing torch earlier than the script would.

Per process it keeps `count-<pid>.json` in ZOO_COUNT_DIR, rewritten after every step, so the
count survives a SIGTERM or SIGKILL: {"pid", "rank", "steps", "by_class", "func_evals"}, where
`func_evals` lists, per step, the closure evaluations LBFGS made in it (its own state counter).

With ZOO_PROBE_STEP=N (N >= 1) it also probes the model after the N-th optimizer step, while
any instrumentation is live: the outermost module holding the optimizer's parameters, and a
`copy.deepcopy` of it, are pickled with every tensor replaced by a persistent id naming its
dtype, shape and the sha256 of its values (a plain pickle names each storage by its memory
address, which differs between two processes holding identical objects, and pickles storages
through torch.save). Everything else, hooks included, is pickled as `pickle.dumps` would.
`probe-<pid>.json` records the sha256 of each pickle (`*_digest`; `*_structure_digest` leaves
the tensors' values out, for scripts that do not seed their weights) and whether it names
otel_train;
`probe-<pid>-pickle.bin` / `probe-<pid>-deepcopy.bin` keep the pickles, to be loaded in a
process without otel_train (loadcheck.py).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys

_DIR = os.environ.get("ZOO_COUNT_DIR")
_PROBE_STEP = int(os.environ.get("ZOO_PROBE_STEP", "0") or 0)
_state = {"steps": 0, "by_class": {}, "func_evals": [], "fd": None, "evals_before": {}}


def _write(path: str, payload: dict) -> None:
    data = json.dumps(payload).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _pre(optimizer, args, kwargs) -> None:  # noqa: ANN001 - torch's hook signature
    state = _lbfgs_state(optimizer)
    if state is not None:
        _state["evals_before"][id(optimizer)] = state.get("func_evals", 0)


def _post(optimizer, args, kwargs) -> None:  # noqa: ANN001
    _state["steps"] += 1
    name = type(optimizer).__name__
    _state["by_class"][name] = _state["by_class"].get(name, 0) + 1
    state = _lbfgs_state(optimizer)
    if state is not None:
        _state["func_evals"].append(state.get("func_evals", 0) - _state["evals_before"].pop(id(optimizer), 0))
    _write(os.path.join(_DIR, f"count-{os.getpid()}.json"), {
        "pid": os.getpid(), "rank": os.environ.get("RANK"), "steps": _state["steps"],
        "by_class": _state["by_class"], "func_evals": _state["func_evals"]})
    if _PROBE_STEP and _state["steps"] == _PROBE_STEP:
        _probe(optimizer)


def _lbfgs_state(optimizer):  # noqa: ANN001, ANN202
    if type(optimizer).__name__ != "LBFGS":
        return None
    params = optimizer.param_groups[0]["params"]
    return optimizer.state[params[0]] if params else {}


def _root_module(optimizer):  # noqa: ANN001, ANN202
    """The outermost nn.Module whose parameters include the optimizer's first parameter."""
    import gc

    import torch

    first = optimizer.param_groups[0]["params"][0]
    # issubclass on the type: a weakref.proxy to a module passes isinstance() but is no module.
    holders = [m for m in gc.get_objects() if issubclass(type(m), torch.nn.Module)
               and any(p is first for p in m.parameters())]
    inner = {id(c) for m in holders for c in m.modules() if c is not m}
    roots = [m for m in holders if id(m) not in inner]
    return roots[0] if roots else None


def _canonical_pickle(obj, values: bool = True) -> bytes:  # noqa: ANN001
    import hashlib
    import io
    import pickle

    import torch

    class Canonical(pickle.Pickler):
        def persistent_id(self, o):  # noqa: ANN001, ANN202
            if isinstance(o, torch.Tensor):
                t = o.detach().cpu().contiguous()
                if not values:
                    return ("tensor", type(o).__qualname__, str(o.dtype), tuple(o.shape), o.requires_grad)
                try:
                    digest = hashlib.sha256(t.numpy().tobytes()).hexdigest()
                except (TypeError, RuntimeError):
                    digest = repr(t.tolist())
                return ("tensor", type(o).__qualname__, str(o.dtype), tuple(o.shape), o.requires_grad, digest)
            return None

    out = io.BytesIO()
    Canonical(out, protocol=4).dump(obj)
    return out.getvalue()


def _probe(optimizer) -> None:  # noqa: ANN001
    import copy
    import hashlib

    base = os.path.join(_DIR, f"probe-{os.getpid()}")
    result: dict = {"pid": os.getpid(), "rank": os.environ.get("RANK"), "step": _state["steps"]}
    module = _root_module(optimizer)
    if module is None:
        result["error"] = "no module holds the optimizer's parameters"
        _write(base + ".json", result)
        return
    result["module"] = type(module).__qualname__
    for kind, make in (("pickle", lambda: module), ("deepcopy", lambda: copy.deepcopy(module))):
        try:
            obj = make()
            raw = _canonical_pickle(obj)
            result[f"{kind}_digest"] = hashlib.sha256(raw).hexdigest()
            result[f"{kind}_structure_digest"] = hashlib.sha256(_canonical_pickle(obj, values=False)).hexdigest()
            result[f"{kind}_mentions_otel_train"] = b"otel_train" in raw
            with open(f"{base}-{kind}.bin", "wb") as f:
                f.write(raw)
        except Exception as exc:  # recorded, compared with the plain run's outcome
            result[f"{kind}_error"] = f"{type(exc).__name__}: {exc}"[:500]
    _write(base + ".json", result)


def _install(module) -> None:  # noqa: ANN001 - the freshly executed torch.optim.optimizer
    module.register_optimizer_step_pre_hook(_pre)
    module.register_optimizer_step_post_hook(_post)


class _WhenTorchOptimizerLoads(importlib.abc.MetaPathFinder):
    """Registers the hooks right after torch.optim.optimizer executes (torch imports it itself)."""

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if name != "torch.optim.optimizer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module) -> None:  # noqa: ANN001
            exec_module(module)
            _install(module)

        spec.loader.exec_module = exec_then_install
        return spec


if _DIR:
    if "torch.optim.optimizer" in sys.modules:
        _install(sys.modules["torch.optim.optimizer"])
    else:
        sys.meta_path.insert(0, _WhenTorchOptimizerLoads())
