"""`otel_train.export.console`: the summary line, its window and its numbers (scripted inputs)."""

from __future__ import annotations

from otel_train.export.console import ConsoleSummary


def test_one_line_every_n_steps_over_the_window_it_closes() -> None:
    totals = {"data": 0.0, "device": 0.0, "dropped": 0}
    lines: list[str] = []
    console = ConsoleSummary(4, lambda: (totals["data"], totals["device"], totals["dropped"]), lines.append)
    for n in range(4):
        totals["data"] += 0.02
        totals["device"] += 0.05
        assert (console.step(n, 0.1, 2048.0, 1e12, 4e13) is None) == (n < 3)
    assert lines == ["otel_train: step 3 | step 100 ms | data 20.0% | device 50.0% | tokens/s 20,480 | MFU 25.0% "
                     "| dropped 0"]
    totals["dropped"] = 7  # the next window: no tokens, no FLOPs, no device time
    for n in range(4, 8):
        totals["data"] += 0.01
        console.step(n, 0.2, None, None, None)
    assert lines[1] == "otel_train: step 7 | step 200 ms | data 5.0% | device - | tokens/s - | MFU - | dropped 7"
