"""`otel-train run` / `python -m otel_train.run` (otel_train.run): the script's traceback is its own.

An exception the script leaves uncaught prints as `python script.py` prints it, without the
frames that ran the script (the console script, the CLI, otel_train.run, runpy), through
`sys.excepthook`, with exit status 1 (issue 26 #7).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from support.procs import clean_env, run_python

SCRIPT = """
import sys
sys.path.insert(0, {helper!r})
import helper

def main():
    helper.fail()

main()
"""
HELPER = "def fail():\n    raise ValueError('boom')\n"
OFF = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}


def _frames(stderr: str) -> list[tuple[str, str]]:
    block = stderr.rsplit("Traceback (most recent call last):", 1)[-1]
    out = []
    for line in block.splitlines():
        line = line.strip()
        if line.startswith('File "') and ", in " in line:
            out.append((Path(line.split('"')[1]).name, line.rsplit(", in ", 1)[1]))
    return out


def _script(tmp_path: Path) -> Path:
    (tmp_path / "helper.py").write_text(HELPER)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(helper=str(tmp_path)))
    return script


def test_a_scripts_traceback_has_only_the_scripts_frames(tmp_path: Path) -> None:
    script = _script(tmp_path)
    plain = run_python(script=script, env=OFF, check=False)
    expected = [("train.py", "<module>"), ("train.py", "main"), ("helper.py", "fail")]
    assert plain.returncode == 1 and _frames(plain.stderr) == expected, plain.stderr
    launchers = {
        "python -m otel_train.run": ["-m", "otel_train.run", str(script)],
        "otel-train run": ["-c", "import sys; from otel_train.cli import main; sys.argv[0] = 'otel-train'; "
                                 "sys.exit(main())", "run", str(script)],
    }
    for name, argv in launchers.items():
        proc = _launch(argv)
        assert proc.returncode == 1, (name, proc.stderr)
        assert _frames(proc.stderr) == expected, (name, proc.stderr)
        assert "ValueError: boom" in proc.stderr


def _launch(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], env=clean_env(OFF), capture_output=True, text=True, timeout=120)


def test_a_scripts_own_excepthook_prints_it(tmp_path: Path) -> None:
    script = tmp_path / "hooked.py"
    script.write_text("import sys\n"
                      "sys.excepthook = lambda t, e, tb: print('HOOK', t.__name__, tb.tb_frame.f_code.co_filename)\n"
                      "raise KeyError('k')\n")
    proc = _launch(["-m", "otel_train.run", str(script)])
    assert proc.returncode == 1
    assert f"HOOK KeyError {script}" in proc.stdout


def test_a_keyboard_interrupt_exits_as_python_does_with_the_scripts_frames(tmp_path: Path) -> None:
    script = tmp_path / "interrupted.py"
    script.write_text("raise KeyboardInterrupt\n")
    plain = _launch([str(script)])
    proc = _launch(["-m", "otel_train.run", str(script)])
    assert plain.returncode == -signal.SIGINT  # CPython ends itself with SIGINT (a shell shows 130)
    assert proc.returncode == plain.returncode
    assert _frames(proc.stderr) == [("interrupted.py", "<module>")]


SHOW_PATHS = ("import os, sys, warnings\n"
              "os.chdir('/')\n"  # a script that moves, then finds its files from __file__
              "print(repr((__file__, sys.argv[0], sys.path[0], os.path.dirname(__file__), __package__,\n"
              "            type(__loader__).__name__)))\n")


def test_file_argv0_and_path0_are_as_python_sets_them(tmp_path: Path) -> None:
    """`__file__` absolute (the working directory joined, `./` and symlinks kept), `sys.argv[0]`
    as typed, `sys.path[0]` the script's real directory: `python script.py`'s, under both
    launchers (issue 54 #4: `otel-train run` left `__file__` relative)."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "main.py").write_text(SHOW_PATHS)
    (tmp_path / "link.py").symlink_to(tmp_path / "sub" / "main.py")
    for typed, cwd in (("sub/main.py", tmp_path), ("./main.py", tmp_path / "sub"), ("link.py", tmp_path),
                       (str(tmp_path / "sub" / "main.py"), tmp_path)):
        plain = subprocess.run([sys.executable, typed], env=clean_env(OFF), cwd=cwd, capture_output=True,
                               text=True, timeout=120)
        assert plain.returncode == 0, plain.stderr
        for launcher in (["-m", "otel_train.run"],
                         ["-c", "import sys; from otel_train.cli import main; sys.argv[0] = 'otel-train'; "
                                "sys.exit(main())", "run"]):
            proc = subprocess.run([sys.executable, *launcher, typed], env=clean_env(OFF), cwd=cwd,
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout == plain.stdout, (typed, launcher, proc.stdout, plain.stdout)



def test_the_resource_names_the_script_not_the_launcher(tmp_path: Path) -> None:
    """`process.command` in the resource the runtime builds at start, before the script runs, is
    the script (argv[0] as typed), not otel_train/run.py."""
    import json
    (tmp_path / "train.py").write_text("import otel_train\nwith otel_train.span('train.forward'):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "otel_train.run", "train.py"],
                          env=clean_env({"OTEL_METRICS_EXPORTER": "none"}), cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    [traces] = tmp_path.glob("otel-train/*/traces-rank0.jsonl")
    resource = json.loads(traces.read_text().splitlines()[0])["resourceSpans"][0]["resource"]["attributes"]
    command = next(a["value"]["stringValue"] for a in resource if a["key"] == "process.command")
    assert command == "train.py"
