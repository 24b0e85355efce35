"""One line to stderr in one write.

`print(line, file=sys.stderr)` writes the text and its newline in two calls. Under torchrun
every rank shares one stderr pipe, so two ranks' closing lines came out as
`...none droppedotel_train: rank 0: ...` and a newline after: one line naming both ranks. A pipe
keeps a single write of up to PIPE_BUF (4 KiB) whole, so each line goes out in one.
"""

from __future__ import annotations

import sys


def line(text: str) -> None:
    """Write `text` and its newline to stderr in one call; a closed stderr is ignored."""
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass  # a closed (or absent) stderr must not stop a shutdown or an export
