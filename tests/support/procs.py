"""Run Python code or a script in a real subprocess, for end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current environment minus every OTEL_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def run_python(code: str | None = None, *, script: str | os.PathLike[str] | None = None,
               args: Sequence[str] = (), env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
               timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `code` (dedented) or `script` with `python`; raise with the output if it fails and `check`."""
    argv = [sys.executable]
    argv += ["-c", textwrap.dedent(code)] if code is not None else [str(script)]
    argv += list(args)
    proc = subprocess.run(argv, env=clean_env(env), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


def jaeger_view_script() -> Path:
    """The real Jaeger UI's driver, `../shared/jaeger-ui/jaeger_view.py` beside the checkout (or
    above a worktree's parent); `$JAEGER_UI_DIR` overrides. May not exist: tests skip then."""
    override = os.environ.get("JAEGER_UI_DIR")
    candidates = [Path(override)] if override else [REPO.parent / "shared" / "jaeger-ui",
                                                   REPO.parent.parent / "shared" / "jaeger-ui"]
    for folder in candidates:
        if (folder / "jaeger_view.py").exists():
            return folder / "jaeger_view.py"
    return candidates[0] / "jaeger_view.py"
