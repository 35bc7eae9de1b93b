"""The committed reports render in a real headless Chromium: tables, plots that decode, no tracebacks.

Without Chromium the tests skip locally, but FAIL under CI (CI=true), so a missing install step fails CI.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from idckit import browser
from idckit.errors import MissingDependencyError

ROOT = Path(__file__).resolve().parents[1]
REPORTS = sorted(p for p in (ROOT / "reports").glob("*.html") if p.name != "index.html")


def _need_chromium():
    try:
        browser.find_chromium()
    except MissingDependencyError as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have Chromium (make setup installs it): {err}")
        pytest.skip("Chromium not installed (run make setup)")



def test_index_screenshot_is_a_real_picture(tmp_path):
    _need_chromium()
    from PIL import Image

    png = browser.screenshot(ROOT / "reports" / "index.html", tmp_path / "index.png", width=1000, height=700)
    img = np.asarray(Image.open(png).convert("L"), dtype=np.float32)
    assert img.shape == (700, 1000)
    assert img.std() > 5, "the screenshot is blank"


def test_index_lists_every_report_with_working_links():
    _need_chromium()
    page = browser.inspect(ROOT / "reports" / "index.html")
    assert page.tables >= 1 and not page.tracebacks
    targets = [link for link in page.links if link.endswith(".html")]
    assert {Path(t).name for t in targets} >= {p.name for p in REPORTS}
    assert all((ROOT / "reports" / t).is_file() for t in targets)


@pytest.mark.parametrize("html", REPORTS, ids=[p.stem for p in REPORTS])
def test_report_renders_tables_and_plots(html):
    _need_chromium()
    page = browser.inspect(html)
    assert page.tables >= 1, "no table rendered"
    assert page.images, "no plot rendered"
    assert not page.broken_images, page.broken_images
    assert not page.tracebacks, page.tracebacks[:3]


def test_the_check_can_fail(tmp_path):
    _need_chromium()
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><table><tr><td>1</td></tr></table><img src='missing.png'>"
                   "<pre>Traceback (most recent call last):\nValueError: boom</pre></body></html>")
    page = browser.inspect(bad)
    assert page.tables == 1 and len(page.broken_images) == 1 and page.tracebacks


def test_missing_chromium_error_says_how_to_install(monkeypatch):
    monkeypatch.setenv("IDCKIT_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.setattr(browser.Path, "is_file", lambda self: False)
    with pytest.raises(MissingDependencyError, match="make setup"):
        browser.find_chromium()
