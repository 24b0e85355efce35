"""The test suite's own torchrun launcher (`support.procs.launch_torchrun`): it launches again only
when torch's abort at interpreter exit (`TORCH_EXIT_ABORT`) is all that went wrong."""

from __future__ import annotations

import subprocess

from support.procs import TORCH_EXIT_ABORT, launch_torchrun, torch_exit_abort


def _failure(*ranks: tuple[int, str]) -> str:
    """torchrun's closing report (as torch 2.13 prints it) for ranks that ended with these exit codes."""
    blocks = [f"[{i}]:\n  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: {100 + rank})\n"
              for i, (rank, code) in enumerate(ranks)]
    return "ChildFailedError:\n====\nscript.py FAILED\n----\nFailures:\n" + "".join(blocks)


def _proc(rc: int, stdout: str = "", stderr: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["torchrun"], rc, stdout, stderr)


ABORT = _proc(1, stderr=TORCH_EXIT_ABORT + "\n" + _failure((1, "-15  (SIGTERM)"), (0, "-6  (SIGABRT)")))


def test_torchs_abort_at_exit_is_told_apart_from_every_other_failure() -> None:
    assert torch_exit_abort(ABORT)
    assert not torch_exit_abort(_proc(0, stderr=TORCH_EXIT_ABORT))  # the run passed
    assert not torch_exit_abort(_proc(1, stderr="Traceback ...\nRuntimeError: boom\n" + _failure((0, "1"))))
    # the same line, but another rank failed on its own: not torch's exit alone
    assert not torch_exit_abort(_proc(1, stderr=TORCH_EXIT_ABORT + "\n" + _failure((0, "-6"), (1, "1"))))
    assert not torch_exit_abort(_proc(1, stderr=_failure((0, "-6  (SIGABRT)"))))  # an abort, not that one
    assert not torch_exit_abort(_proc(1, stderr=TORCH_EXIT_ABORT + "\n" + _failure((0, "-11  (SIGSEGV)"))))


def test_the_line_is_read_from_torchruns_log_dir_too(tmp_path) -> None:
    (tmp_path / "attempt_0" / "0").mkdir(parents=True)
    (tmp_path / "attempt_0" / "0" / "stderr.log").write_text(TORCH_EXIT_ABORT + "\n")
    redirected = _proc(1, stderr=_failure((0, "-6  (SIGABRT)")))
    assert not torch_exit_abort(redirected)
    assert torch_exit_abort(redirected, logs=tmp_path)


def test_launched_once_more_after_torchs_abort_and_never_after_another_failure() -> None:
    calls: list[str] = []

    def sequence(*procs: subprocess.CompletedProcess[str]):
        it = iter(procs)
        return lambda: (calls.append("launch"), next(it))[1]

    ok = _proc(0)
    assert launch_torchrun(sequence(ABORT, ok), again=lambda: calls.append("again")) is ok
    assert calls == ["launch", "again", "launch"]
    calls.clear()
    assert launch_torchrun(sequence(ABORT, ABORT), again=lambda: calls.append("again")) is not ok  # twice: it fails
    assert calls == ["launch", "again", "launch"]
    calls.clear()
    boom = _proc(1, stderr=_failure((0, "1")))
    assert launch_torchrun(sequence(boom, ok), again=lambda: calls.append("again")) is boom
    assert calls == ["launch"]
