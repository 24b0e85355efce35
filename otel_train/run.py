"""`python -m otel_train.run script.py args…`: run a training script, unmodified, instrumented.

Like `opentelemetry-instrument`, but for otel_train alone: it does what `import otel_train.auto`
does, then runs the script as `__main__` with `sys.argv` and `sys.path[0]` set as `python
script.py args…` would set them. `-m module args…` runs a module instead. Works under torchrun:

    torchrun --nproc-per-node 4 -m otel_train.run train.py --lr 3e-4

`main(argv)` returns the script's exit status (the CLI's `otel-train run` calls it). An exception
the script leaves uncaught is printed as `python script.py` prints it: through `sys.excepthook`,
without the frames of this module and `runpy` that ran the script (exit status 1, 130 for
KeyboardInterrupt), and the interpreter then exits as usual (`atexit`, our shutdown included).
"""

from __future__ import annotations

import builtins
import importlib.machinery
import io
import os
import runpy
import sys
import types
from collections.abc import Sequence

_USAGE = "usage: python -m otel_train.run (script.py | -m module) [args ...]"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the script (or `-m module`) in `argv` instrumented; return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    module = None
    if args[0] == "-m":
        if len(args) < 2:
            print(_USAGE, file=sys.stderr)
            return 2
        module, rest = args[1], args[2:]
    else:
        script, rest = args[0], args[1:]
        if not os.path.exists(script):
            print(f"otel_train.run: cannot open {script!r}: no such file", file=sys.stderr)
            return 2

    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    # The script's argv already while we start: the resource's `process.command` is the script.
    sys.argv = [module, *rest] if module is not None else [script, *rest]  # as typed, as python leaves it
    import otel_train.auto  # noqa: F401 - configure and instrument before the script runs

    try:
        if module is not None:
            _set_path0(os.getcwd())  # `python -m` puts the working directory first
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            _set_path0(_script_dir(script))
            _run_script(script)
    except SystemExit as exit_:
        return _exit_status(exit_.code)
    except BaseException as err:  # noqa: BLE001 - uncaught by the script: printed as Python would
        _print_uncaught(err)
        return 130 if isinstance(err, KeyboardInterrupt) else 1
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and module is None:
            sys.path[0] = saved_path0
    return 0


def _run_script(script: str) -> None:
    """Run `script` as `python script` does. `__file__` (and the code's file name, so tracebacks
    and warnings) is absolute: the working directory joined, symlinks and `./` kept. `runpy`
    would set `sys.argv[0]` to that path too, and a `__loader__` of None: so a plain file runs
    here, in a fresh `__main__` put in place of ours for the run (pickle looks classes up there)."""
    path = os.path.join(os.getcwd(), script)
    if os.path.isdir(path) or _is_zip(path):
        runpy.run_path(path, run_name="__main__")  # its __main__.py, with the directory first on the path
        return
    with io.open_code(path) as source:
        code = compile(source.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path),
                         __builtins__=builtins)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _set_path0(entry: str) -> None:
    if sys.path:
        sys.path[0] = entry
    else:
        sys.path.insert(0, entry)


def _script_dir(script: str) -> str:
    """`sys.path[0]` for `python script`: the directory of the script with its symlinks
    resolved, or the script itself when it is a directory or a zip file (it holds `__main__`)."""
    if os.path.isdir(script) or _is_zip(script):
        return os.path.abspath(script)
    return os.path.dirname(os.path.realpath(script))


def _is_zip(path: str) -> bool:
    if path.endswith(".py"):
        return False
    import zipfile
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


#: Files whose frames lead into the script: this module and `runpy` (frozen or not).
_OURS = frozenset((__file__, runpy.__file__, "<frozen runpy>"))


def _print_uncaught(err: BaseException) -> None:
    """`sys.excepthook` with the traceback starting at the script's first frame."""
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OURS:
        tb = tb.tb_next
    err.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(err), err, tb
    sys.excepthook(type(err), err, tb)


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
