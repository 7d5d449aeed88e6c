"""report.html in a real browser: headless Chromium draws a page that is not blank and loads every figure.

Skips when no Chromium is installed, unless DETOUR_REQUIRE_BROWSER=1 (CI), which makes that a failure.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import missing

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-extensions", "--disable-dev-shm-usage"]
# Appended to a copy of the page: once everything has loaded, write into the DOM how many images decoded.
PROBE = ("<script>window.addEventListener('load', () => { const all = [...document.images];"
         " document.body.setAttribute('data-images', all.filter(i => i.complete && i.naturalWidth > 0).length"
         " + '/' + all.length); });</script>")


@pytest.fixture(scope="session")  # session, as the study it needs: so a missing browser skips before that is built
def chromium() -> str:
    found = next((p for p in map(shutil.which, CANDIDATES) if p), None)
    if found is None:
        missing("DETOUR_REQUIRE_BROWSER",
                f"no Chromium binary found (looked for {', '.join(CANDIDATES)} on PATH; apt-get install chromium)")
    return found


def _browser(chromium: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium, *FLAGS, *args], capture_output=True, text=True, timeout=120)


def test_screenshot_is_not_blank(chromium, report, tmp_path):
    from matplotlib.image import imread

    shot = tmp_path / "report.png"
    done = _browser(chromium, f"--screenshot={shot}", "--window-size=1280,4000",
                    report["html"].resolve().as_uri())
    assert shot.is_file(), f"no screenshot written: {done.stderr[-2000:]}"
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (4000, 1280)
    # A blank page is one colour; text, tables and figures give a spread of values over the page.
    assert float(pixels.std()) > 0.05
    rows_with_ink = (pixels.min(axis=(1, 2)) < 0.5).mean()
    assert rows_with_ink > 0.2, f"only {rows_with_ink:.0%} of the rows have any dark pixel"


def test_every_image_loads(chromium, report, tmp_path):
    page = tmp_path / "probe.html"
    page.write_text(report["html_text"].replace("</body>", PROBE + "</body>"), encoding="utf-8")
    done = _browser(chromium, "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    match = re.search(r'data-images="(\d+)/(\d+)"', done.stdout)
    assert match, f"the page did not report its images: {done.stdout[:500]} {done.stderr[-2000:]}"
    loaded, total = map(int, match.groups())
    assert total == len(list((report["markdown"].parent / "report-figures").glob("*.png"))) > 0
    assert loaded == total


def test_a_broken_image_is_caught(chromium, report, tmp_path):
    """The probe itself can fail: a page with one corrupt data URI reports one image not loaded."""
    html = re.sub(r'src="data:image/png;base64,[^"]{16}', 'src="data:image/png;base64,AAAAAAAAAAAAAAAA',
                  report["html_text"], count=1)
    page = tmp_path / "broken.html"
    page.write_text(html.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    done = _browser(chromium, "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    loaded, total = map(int, re.search(r'data-images="(\d+)/(\d+)"', done.stdout).groups())
    assert loaded == total - 1
