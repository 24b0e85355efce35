"""Load saved files in a process where otel_train cannot be imported; print one JSON line.

`python loadcheck.py FILE ...` (run with the script's working directory as cwd and on
sys.path, so the script's own modules unpickle). For each file: the globals a
`weights_only=True` load would refuse (torch's own `get_unsafe_globals_in_checkpoint`, for
torch.save zip files), and whether a full load (`torch.load(weights_only=False)`; for
the probes' pickles (`*.bin`, tensors as persistent ids) an unpickling with a placeholder
for each tensor) succeeds here, without otel_train.
"""

from __future__ import annotations

import json
import pickle
import sys

# Blocks `import otel_train` and every `otel_train.*` (the parent is looked up first), even
# though the package is installed in site-packages: this is a process "without otel_train".
sys.modules["otel_train"] = None  # type: ignore[assignment]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def check(path: str) -> dict[str, object]:
    import torch

    out: dict[str, object] = {}
    if path.endswith(".bin"):
        class Placeholders(pickle.Unpickler):
            def persistent_load(self, pid):  # noqa: ANN001, ANN202 - a tensor: not needed here
                return None

            def find_class(self, module, name):  # noqa: ANN001, ANN202
                # A class the script defined in its __main__ (a plain pickle cannot name it
                # elsewhere): stand in an empty nn.Module subclass. Every other global,
                # otel_train's included, is imported as pickle would.
                if module == "__main__":
                    return type(name, (torch.nn.Module,), {})
                return super().find_class(module, name)

        try:
            with open(path, "rb") as f:
                Placeholders(f).load()
            out["load"] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported, compared with the plain run's
            out["load"] = _error(exc)
        return out
    try:
        out["unsafe_globals"] = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception as exc:  # noqa: BLE001
        out["unsafe_globals"] = _error(exc)
    try:
        torch.load(path, weights_only=False)
        out["load"] = "ok"
    except Exception as exc:  # noqa: BLE001
        out["load"] = _error(exc)
    return out


if __name__ == "__main__":
    print(json.dumps({path: check(path) for path in sys.argv[1:]}))
