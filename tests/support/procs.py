"""Run Python code or a script in a real subprocess, for end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_SLOW_EXPORTER_START = Path(__file__).resolve().parent / "slow_exporter_start"


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current environment minus every OTEL_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def slow_exporter_start(seconds: float) -> dict[str, str]:
    """Environment in which otel_train's exporter process takes `seconds` to start, as on a loaded
    node (`slow_exporter_start/sitecustomize.py`); for `clean_env`'s `extra`."""
    return {"PYTHONPATH": os.pathsep.join([str(_SLOW_EXPORTER_START), str(REPO), os.environ.get("PYTHONPATH", "")]),
            "TESTS_EXPORTER_START_DELAY_S": str(seconds)}


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


def pytest_without(module: str, check: str, pytest_args: Sequence[str],
                   timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Run pytest on `pytest_args` (from the repository) in a subprocess where C extension
    `module` cannot be imported, as where no compiler was at install, after `check` (code that
    asserts the Python fallbacks are the ones in use). Returns the process, never raises."""
    code = (f"import sys; sys.modules[{module!r}] = None\n{textwrap.dedent(check)}\nimport pytest\n"
            f"raise SystemExit(pytest.main(['-q', '-p', 'no:cacheprovider', *{list(pytest_args)!r}]))\n")
    return run_python(code, cwd=REPO, timeout=timeout, check=False)


#: torch's own abort at interpreter exit, with or without otel_train: a gloo worker thread drops
#: the last collective issued inside `backward()` (DDP's gradient all-reduce), whose thread-local
#: state holds the autograd context torch stashes there (`torch.autograd.graph._engine_run_backward`),
#: only once the interpreter has begun finalizing; taking the GIL then ends the thread inside a
#: C++ destructor, and the rank dies by SIGABRT after its work is done (pytorch/pytorch#179291,
#: abandoned). Seen in ~1 of 20 plain 4-rank `ddp_hooked.py` launches on the 2-core CI machine,
#: and on 2026-11-27 in 3 of 8 (twice in a row once, which failed CI); a barrier before
#: `destroy_process_group()` did not stop it (2 of 29), nor did one more all-reduce (2 of 12)
#: or `del model` alone (4 of 16). `del model, opt` and a `gc.collect()` first did (0 of 20):
#: the DDP scenarios end so, and a launch that still aborts is launched once more.
TORCH_EXIT_ABORT = "terminate called without an active exception"


def torch_exit_abort(proc: subprocess.CompletedProcess[str], logs: Path | None = None) -> bool:
    """Whether a torchrun launch failed by torch's abort at exit (`TORCH_EXIT_ABORT`) and nothing else
    torchrun reported: every failed rank says that line's SIGABRT or was stopped by torchrun after it.
    `logs`: torchrun's `--log-dir`, where the ranks' output goes with `--redirects`."""
    text = (proc.stdout or "") + (proc.stderr or "")
    if logs is not None:
        text += "".join(p.read_text(errors="replace") for p in sorted(logs.rglob("*.log")))
    if proc.returncode == 0 or TORCH_EXIT_ABORT not in text:
        return False
    exits = [line.split(":", 1)[1].split()[0] for line in text.splitlines() if line.strip().startswith("exitcode")]
    return bool(exits) and "-6" in exits and set(exits) <= {"-6", "-15"}


def launch_torchrun(launch: Callable[[], subprocess.CompletedProcess[str]],
                    again: Callable[[], None] | None = None, logs: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a torchrun launch; when it failed by torch's abort at exit alone (`torch_exit_abort`),
    say so on stderr, call `again` (to forget what the failed launch left) and launch it once more.
    Any other failure, or the same one twice, is returned as it is for the test to fail on."""
    proc = launch()
    if torch_exit_abort(proc, logs):
        print("torch's gloo abort at exit (tests/support/procs.py TORCH_EXIT_ABORT); launching again",
              file=sys.stderr)
        if again is not None:
            again()
        proc = launch()
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
