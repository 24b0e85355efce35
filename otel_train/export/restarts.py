"""Steps redone after an elastic restart: which step numbers an earlier attempt already ran.

An elastic restart (torchrun `--max-restarts`, `TORCHELASTIC_RESTART_COUNT` > 0) starts every
worker again with the same run id; the job resumes from its last checkpoint, so the steps
between that checkpoint and where the failed attempt stopped run a second time. Their spans
land in the same step traces as the first attempt's, with different span ids (the step span
id includes the attempt, `wire.ids.step_span_id`; regions use the process's random salt) and
`ml.restart` on the resource; this module makes them say so: the step spans of attempt k whose
step number an earlier attempt reached are tagged `redone`.

How a restarted process knows, with no communication and nothing read from the dead attempt's
memory: every exporter of a run that may restart (`TORCHELASTIC_MAX_RESTARTS` > 0, or already
restarted) keeps a one-number marker file, the highest step it has seen, in a node-local
directory (`<tmp>/otel-train-<uid>/<run id>/progress-r<attempt>-rank<rank>`), rewritten at most
once per drain and only when the number grew. A process of attempt k reads every marker of
attempts below k on its node at start: any rank's will do, step numbers are global. Elastic
restarts rerun the workers on the same nodes (the agents survive), so the markers are there;
a rank moved to a node without markers tags nothing, and `diagnose` still finds its redone
steps (a step number seen again with a higher `ml.restart`). Why not "every step below the
first one this attempt saw": the first step of a resumed attempt is the checkpoint's, and the
redone steps are the ones *after* it, up to where the failed attempt got.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

from otel_train._distributed import RunInfo

_log = logging.getLogger("otel_train")
_MARKER = re.compile(r"^progress-r(\d+)-rank(\d+)$")


def progress_dir(run_id: str, base: str | None = None) -> Path:
    """The node-local directory of a run's markers."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:200] or "run"
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(base or tempfile.gettempdir()) / f"otel-train-{uid}" / safe


def may_restart(run: RunInfo, environ: Mapping[str, str] | None = None) -> bool:
    """Whether markers are worth keeping: the launcher allows restarts, or one happened."""
    environ = os.environ if environ is None else environ
    try:
        allowed = int(environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    except ValueError:
        allowed = 0
    return run.restart > 0 or allowed > 0


class RestartProgress:
    """This process's marker, and the highest step earlier attempts reached (`redone_upto`)."""

    def __init__(self, run: RunInfo, directory: Path) -> None:
        self.dir = directory
        self.path = directory / f"progress-r{run.restart}-rank{run.rank}"
        self.highest: int | None = None
        self._written: int | None = None
        #: The highest step number any earlier attempt of this run reached on this node, or None.
        self.redone_upto: int | None = earlier_high(directory, run.restart) if run.restart > 0 else None

    def redone(self, step: int) -> bool:
        return self.redone_upto is not None and step <= self.redone_upto

    def note(self, step: int) -> None:
        """A step this attempt has run (called per step held: a comparison, nothing more)."""
        if self.highest is None or step > self.highest:
            self.highest = step

    def flush(self) -> None:
        """Write the marker if the highest step grew since the last write (once per drain)."""
        if self.highest is None or self.highest == self._written:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(str(self.highest))
            os.replace(tmp, self.path)  # a reader never sees a half-written number
            self._written = self.highest
        except OSError as err:
            if self._written is None:
                _log.warning("otel_train: cannot keep the restart marker %s (%s); steps redone after an "
                             "elastic restart will not be tagged 'redone'.", self.path, err)
            self._written = self.highest  # say it once; try again when the step grows


def earlier_high(directory: Path, restart: int) -> int | None:
    """The highest step in the markers of attempts before `restart` (None: no marker)."""
    best: int | None = None
    try:
        entries = list(directory.iterdir())
    except OSError:
        return None
    for entry in entries:
        m = _MARKER.match(entry.name)
        if m is None or int(m.group(1)) >= restart:
            continue
        try:
            step = int(entry.read_text().strip())
        except (OSError, ValueError):
            continue
        best = step if best is None else max(best, step)
    return best
