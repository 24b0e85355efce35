"""`otel-train report`: the page in headless Chromium, and what it draws for big runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.browser import available, chromium, screenshot_census
from support.synth_runs import Plan, write_run

from otel_train.analyze import report
from otel_train.analyze.diagnose import analyse
from otel_train.cli import main

needs_browser = pytest.mark.skipif(not available(), reason="needs selenium, /usr/bin/chromium and chromedriver")
#: A drawn report has dozens of colours and ink on a good share of the page; a blank one neither.
MIN_COLOURS, MIN_INK = 20, 0.05


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    plan = Plan(ranks=3, steps=30, device=True, straggler={1: 40.0}, slow_steps={20: 80.0}, jitter_ms=1.0,
                siblings={5: [("train.checkpoint", 60.0)], 10: [("train.eval", 50.0)]}, gc={7: 20.0},
                offsets_ms={2: 12.0}, zero_grad_ms=2.0, other_ms=4.0)
    write_run(plan, tmp / "run")
    assert main(["report", str(tmp / "run"), "-o", str(tmp / "report.html")]) == 0
    return tmp / "report.html"


def test_page_is_self_contained(page: Path) -> None:
    text = page.read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)  # nothing fetched
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text)
    assert "rank 1 straggles" in text


def _errors(driver) -> list[dict]:  # type: ignore[no-untyped-def]
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


@needs_browser
def test_report_in_chromium(page: Path) -> None:
    with chromium() as driver:
        driver.get(page.as_uri())
        assert driver.execute_script("return document.body.dataset.rendered") is not None
        assert _errors(driver) == []
        q = driver.execute_script
        assert q("return document.getElementById('verdict').textContent").startswith("rank 1 straggles")
        assert q("return [document.getElementById('summary').dataset.ranks, "
                 "document.getElementById('summary').dataset.steps]") == ["3", "30"]
        gantt = q("const g = document.getElementById('gantt'); return [g.dataset.ranks, g.dataset.steps, "
                  "g.querySelectorAll('g.rank-row').length, new Set([...g.querySelectorAll('rect.step')]"
                  ".map(r => r.dataset.step)).size]")
        assert gantt == ["3", str(report.WINDOW_STEPS), 3, report.WINDOW_STEPS]
        phases = q("return [...document.querySelectorAll('#legend .phase')].map(e => e.dataset.phase)")
        assert phases == ["train.data", "train.forward", "train.backward", "train.optimizer", "train.zero_grad",
                          "train.collective", "(outside phase spans)"]
        counts = q("const g = document.getElementById('gantt'); return ['rect.device', 'rect.mark.checkpoint', "
                   "'rect.mark.eval', 'rect.mark.gc', 'rect.step.straggler', 'path.tag', 'rect.outside', "
                   "'rect.mark.other'].map(s => g.querySelectorAll(s).length)")
        assert counts[0] > 0 and counts[1:4] == [3, 3, 3]  # device lanes; one mark per rank
        assert counts[4] >= 20 and counts[5] >= 3  # rank 1 outlined; checkpoint/eval/gc tags
        # all the time drawn: every step's extent under its phases, the script's own time beside
        assert counts[6] == 3 * report.WINDOW_STEPS and counts[7] == 3 * report.WINDOW_STEPS
        assert q("return document.querySelectorAll('#phases g.bar').length") == 30
        assert q("return document.querySelectorAll('#phases .slow-dot').length") == 1
        # the last window: the slow step 20 highlighted across the ranks
        q("[...document.querySelectorAll('#windows button')].pop().click()")
        assert q("return document.querySelectorAll('#gantt rect.slow-band').length") == 1
        # one verdict: the key figure, the triangles and the dots name the same slow step
        assert q("return document.getElementById('n-slow').querySelector('b').textContent") == "1"
        assert q("return document.querySelectorAll('#gantt path.tag.slow').length") == 3
        assert q("return document.querySelectorAll('#goodput rect.goodput-part').length") >= 5
        colours, ink = screenshot_census(driver)
        assert colours >= MIN_COLOURS and ink >= MIN_INK, (colours, ink)


@needs_browser
def test_the_screenshot_check_fails_on_a_blank_page(tmp_path: Path) -> None:
    blank = tmp_path / "blank.html"
    blank.write_text("<!doctype html><html><body></body></html>")
    with chromium() as driver:
        driver.get(blank.as_uri())
        colours, ink = screenshot_census(driver)
    assert not (colours >= MIN_COLOURS and ink >= MIN_INK), (colours, ink)


def test_big_runs_are_sampled_and_say_so(tmp_path: Path) -> None:
    write_run(Plan(ranks=40, steps=40, straggler={37: 30.0}, steps_per_line=40), tmp_path / "wide")
    data = report.report_data(analyse(tmp_path / "wide"))
    assert len(data["ranks_drawn"]) == report.MAX_RANKS and 37 in data["ranks_drawn"]
    assert any("32 of 40 ranks" in n for n in data["notes"])
    write_run(Plan(ranks=1, steps=1300, forward_ms=2, backward_ms=3, data_ms=1, startup_ms=10, slow_steps={650: 9.0},
                   steps_per_line=200), tmp_path / "long")
    d = analyse(tmp_path / "long")
    data = report.report_data(d)
    assert data["series"]["bucket"] == 3 and len(data["series"]["bars"]) == 434
    assert all(len(w["steps"]) <= report.WINDOW_STEPS for w in data["windows"]) and len(data["windows"]) >= 3
    assert any("mean of 3 consecutive steps" in n for n in data["notes"])
    html_size = len(report.render(d).encode())
    assert html_size < 200_000  # mailable; the 10,000-step figure is in docs/analysis.md


@needs_browser
def test_a_2000_step_chart_keeps_every_slow_dot_and_readable_labels(tmp_path: Path) -> None:
    """Issue 55: the dots stopped after the first 200 slow steps' worth; clipped bars' labels
    overlapped into a black band."""
    slow = {n: 30.0 for n in range(50, 2000, 97)}  # 21 slow steps, spread over the run
    tall = {n: 400.0 for n in range(1000, 1040)}  # 40 clipped bars side by side
    write_run(Plan(ranks=1, steps=2000, forward_ms=2, backward_ms=3, data_ms=1, startup_ms=10,
                   slow_steps={**slow, **tall}, steps_per_line=500), tmp_path / "run")
    d = analyse(tmp_path / "run")
    assert set(slow) <= set(d.slow_steps)
    data = report.report_data(d)
    dotted = {b for b, _, _ in data["series"]["slow"]}
    bars = data["series"]["bars"]
    assert all(any(bars[b][0] <= n <= bars[b][1] for b in dotted) for n in d.slow_steps)
    (tmp_path / "r.html").write_text(report.render(d))
    with chromium() as driver:
        driver.get((tmp_path / "r.html").as_uri())
        assert _errors(driver) == []
        q = driver.execute_script
        assert q("return document.querySelectorAll('#phases .slow-dot').length") == len(dotted)
        boxes = q("return [...document.querySelectorAll('#phases text.clipped')].map(t => { const b = t.getBBox(); "
                  "return [b.x, b.x + b.width]; })")
        assert boxes and all(b[0] >= a[1] for a, b in zip(boxes, boxes[1:]))  # no label over another
        assert q("return document.querySelectorAll('#phases path.clipped-mark').length") == 40 // data["series"]["bucket"]


@needs_browser
def test_actors_have_their_own_lanes(tmp_path: Path) -> None:
    from support.synth_runs import write_pipeline
    write_pipeline("balanced", tmp_path / "dump.jsonl", steps=12, links=True)
    d = analyse(tmp_path / "dump.jsonl")
    (tmp_path / "r.html").write_text(report.render(d))
    with chromium() as driver:
        driver.get((tmp_path / "r.html").as_uri())
        assert _errors(driver) == []
        lanes = driver.execute_script("return [...document.querySelectorAll('#gantt g.actor-row')].map(g => "
                                      "[g.dataset.actor, g.querySelectorAll('rect.call').length])")
    assert [name for name, _ in lanes] == ["inference 0", "inference 1", "inference 2"]
    assert all(calls > 0 for _, calls in lanes)
