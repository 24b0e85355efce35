"""Headless Chromium for the tests (Debian's chromium + chromedriver), and a PNG reader.

`chromium()` starts one with the flags that keep it offline and stateless (a fresh profile).
`screenshot_census()` says how much a screenshot holds (colours, inked share), so a test can
tell a drawn page from a blank one.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run")


def available() -> bool:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return False
    return bool(shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER))


@contextmanager
def chromium(width: int = 1300, height: int = 1600) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


_CENSUS_JS = """
const [b64, step, done] = arguments;
const img = new Image();
img.onload = () => {
  const c = document.createElement("canvas");
  c.width = img.width; c.height = img.height;
  const ctx = c.getContext("2d");
  ctx.drawImage(img, 0, 0);
  const px = ctx.getImageData(0, 0, c.width, c.height).data;
  const colours = new Set();
  let ink = 0, seen = 0;
  for (let y = 0; y < c.height; y += step) for (let x = 0; x < c.width; x += step) {
    const i = 4 * (y * c.width + x);
    colours.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
    seen++;
    if (px[i] < 250 || px[i + 1] < 250 || px[i + 2] < 250) ink++;
  }
  done([colours.size, ink / seen]);
};
img.onerror = () => done([0, 0]);
img.src = "data:image/png;base64," + b64;
"""


def screenshot_census(driver: Any, step: int = 3) -> tuple[int, float]:
    """(distinct colours, share of non-white pixels) of a screenshot of the current page,
    counted by the browser itself (a canvas) on a blank page, so no imaging library is needed."""
    png = driver.get_screenshot_as_base64()
    driver.get("about:blank")
    colours, ink = driver.execute_async_script(_CENSUS_JS, png, step)
    return int(colours), float(ink)
