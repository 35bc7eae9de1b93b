"""The committed reports render in a real headless Chromium: tables, plots that decode, no tracebacks.

Without Chromium these tests skip locally, but FAIL under CI (CI=true), so a missing install step fails CI.
The error-path tests use a fake Chromium script and run everywhere.
"""
from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import numpy as np
import pytest

from idckit.reports import browser
from idckit.errors import IdckitError, MissingDependencyError

ROOT = Path(__file__).resolve().parents[1]
# every report page; not index.html, and not hidden or _tmp-* files a running `idckit reproduce` may leave
REPORTS = sorted(p for p in (ROOT / "reports").glob("*.html")
                 if p.name != "index.html" and not p.name.startswith((".", "_")))
# a 1x1 PNG, as our reports embed their plots (base64 data: URIs)
PNG_1PX = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5E"
                           "rkJggg==")


@pytest.fixture(scope="module")
def chromium():
    try:
        return browser.find_chromium()
    except MissingDependencyError as err:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"CI must have Chromium (make setup installs it): {err}")
        pytest.skip("Chromium is not installed (make setup installs it; CI=true turns this skip into a failure)")


def _gray(png: Path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(png).convert("L"), dtype=np.float32)


def test_index_screenshot_is_a_real_picture(chromium, tmp_path):
    png = browser.screenshot(ROOT / "reports" / "index.html", tmp_path / "index.png", width=1000, height=700)
    img = _gray(png)
    assert img.shape == (700, 1000)
    assert img.std() > 5, "the screenshot is blank"


def test_screenshot_window_and_full_page(chromium, tmp_path):
    page = tmp_path / "tall.html"
    page.write_text('<!doctype html><html><head><style>body{margin:0}</style></head><body>'
                    '<div style="height:850px;background:#f00"></div><div style="height:2000px;background:#00f"></div>'
                    "</body></html>")
    from PIL import Image

    rgb = np.asarray(Image.open(browser.screenshot(page, tmp_path / "a.png", width=600, height=900)).convert("RGB"))
    assert rgb.shape == (900, 600, 3)
    assert tuple(rgb[840, 300]) == (255, 0, 0) and tuple(rgb[860, 300]) == (0, 0, 255)  # the window is the viewport
    full = browser.screenshot(page, tmp_path / "b.png", width=600, full_page=True)
    full = np.asarray(Image.open(full).convert("RGB"))
    assert full.shape == (2850, 600, 3) and tuple(full[-1, 300]) == (0, 0, 255)
    assert not list(tmp_path.glob(".*"))  # no temporary PNG left behind


def test_index_lists_every_report_with_working_links(chromium):
    page = browser.inspect(ROOT / "reports" / "index.html")
    assert page.tables >= 1 and not page.tracebacks and not page.error_cells
    targets = [link for link in page.links if link.endswith(".html")]
    assert all((ROOT / "reports" / t).is_file() for t in targets), targets
    missing = {p.name for p in REPORTS} - {Path(t).name for t in targets}
    assert not missing, f"reports not on the index (re-run `idckit reproduce` to rewrite it): {sorted(missing)}"


@pytest.mark.parametrize("html", REPORTS, ids=[p.stem for p in REPORTS])
def test_report_renders_tables_and_plots(chromium, html):
    page = browser.inspect(html)
    assert page.tables >= 1, "no table rendered"
    assert page.images, "no plot rendered"
    assert not page.broken_images, page.broken_images
    assert not page.tracebacks, page.tracebacks[:3]
    assert not page.error_cells, page.error_cells[:3]


@pytest.mark.parametrize("html", REPORTS, ids=[p.stem for p in REPORTS])
def test_report_says_where_its_numbers_come_from_and_leaks_nothing(html):
    """Every committed report ends with its provenance block and notes (idckit.reports.report.report_summary), and shows
    no object repr returned by a cell's last line and no path of the staging folder it ran in."""
    import re
    from html import unescape

    from idckit.reports.report import read_report

    page = unescape(html.read_text())
    leak = re.search(r" at 0x[0-9a-f]+|Text\(\d|_tmp-|report written to", page)
    assert not leak, f"{html.name} shows {leak.group(0)!r}: re-run `idckit reproduce {html.stem}`"
    assert "Provenance" in page and "training time" in page, f"{html.name} has no provenance block"
    doc = read_report(html.with_suffix(".json"))
    assert all(n in page for n in doc["notes"]), f"{html.name} does not show its JSON's notes"


STATUS_HEADER = (0xDD, 0xE8, 0xF5)        # th.c-status in idckit/reports/index.py


def _summary_card(cards: list[dict]) -> dict:
    """The report's own card (``id=idckit-card``); a card shown inside an output, as the walkthrough's example of
    its own card, is not it."""
    own = [c for c in cards if c["id"] == "idckit-card"]
    assert len(own) == 1, f"expected one summary card, found {cards}"
    return own[0]


@pytest.mark.parametrize("html", REPORTS, ids=[p.stem for p in REPORTS])
def test_the_card_is_in_the_first_screen(chromium, html, tmp_path):
    """The summary card, as `idckit reproduce` inserts it (idempotent on a report that already has one), lies in the
    first 1400x900 screen and fills a good part of it: the verdict is read before any prose or table."""
    from idckit.reports.report import read_report
    from idckit.reports.card import with_card

    page = tmp_path / html.name
    page.write_text(with_card(html.read_text(encoding="utf-8"), read_report(html.with_suffix(".json"))))
    card = _summary_card(browser.inspect(page, width=1400, height=900).cards)
    assert card["bottom"] <= 900, f"{html.name}: the card ends below the first screen: {card}"
    share = (card["right"] - card["left"]) * (card["bottom"] - card["top"]) / (1400 * 900)
    assert share > 0.1, f"{html.name}: the card covers {share:.1%} of the first screen"


def test_the_card_position_check_can_fail(chromium, tmp_path):
    page = tmp_path / "late.html"
    page.write_text('<!doctype html><html><body style="margin:0"><div class="idckit-card" style="height:50px">'
                    'an example card in an output</div><div style="height:2000px"></div>'
                    '<div class="idckit-card" id="idckit-card" style="height:100px">verdict</div></body></html>')
    card = _summary_card(browser.inspect(page, width=1400, height=900).cards)
    assert card == {"id": "idckit-card", "top": 2050, "bottom": 2150, "left": 0, "right": 1400}


def test_the_index_status_column_is_visible_at_1024_px(chromium, tmp_path):
    png = browser.screenshot(ROOT / "reports" / "index.html", tmp_path / "index.png", width=1024, height=700)
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    hits = np.argwhere(np.abs(img - np.array(STATUS_HEADER)).max(axis=2) <= 3)
    assert len(hits) > 200, "the status column's header is not on the first screen at 1024 px"
    assert hits[:, 1].max() < 1024 - 5


def test_the_check_can_fail(chromium, tmp_path):
    (tmp_path / "ok.png").write_bytes(PNG_1PX)
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><html><head><title>bad</title></head><body>"
                   "<table><tr><td>1</td><td>KeyError</td></tr></table>"
                   f"<img src='data:image/png;base64,{base64.b64encode(PNG_1PX).decode()}'>"
                   "<img src='ok.png'><img src='missing.png'>"
                   "<pre>Traceback (most recent call last):\nValueError: boom</pre></body></html>")
    page = browser.inspect(bad)
    assert page.title == "bad" and page.tables == 1
    loaded = {im["src"]: im["loaded"] for im in page.images}
    assert loaded == {f"data:image/png;base64,{base64.b64encode(PNG_1PX).decode()}"[:80]: True,
                      "ok.png": True, "missing.png": False}  # relative images resolve beside the original page
    assert page.tracebacks == ["Traceback (most recent call last)", "ValueError: "]
    assert page.error_cells == ["KeyError"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.html", "ok.png"]  # nothing written beside it


def test_probe_goes_after_the_doctype_and_into_the_head():
    with_head = browser._with_probe("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>x</body></html>",
                                    "file:///r/")
    assert with_head.startswith('<!DOCTYPE html><html><head><base href="file:///r/"><meta')
    no_head = browser._with_probe("<!doctype html><p>x", "file:///r/")
    assert no_head.startswith('<!doctype html><base href="file:///r/"><p>x') and no_head.endswith("</script>")


def _fake_chromium(tmp_path, monkeypatch, body: str) -> None:
    fake = tmp_path / "fake-chromium"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("IDCKIT_CHROMIUM", str(fake))


def test_a_failing_chromium_is_reported_with_its_stderr(tmp_path, monkeypatch):
    _fake_chromium(tmp_path, monkeypatch, "echo 'cannot open display: the real reason' >&2; exit 3")
    page = tmp_path / "p.html"
    page.write_text("<p>x</p>")
    with pytest.raises(IdckitError, match=r"exit 3\)[\s\S]*the real reason"):
        browser.screenshot(page, tmp_path / "p.png")
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob(".*"))


def test_a_hanging_chromium_times_out_and_is_killed_with_its_children(tmp_path, monkeypatch):
    # like Debian's launcher: a shell script whose browser runs as a child, not exec'd
    _fake_chromium(tmp_path, monkeypatch, f"echo starting >&2; sleep 30 & echo $! > {tmp_path}/child; wait")
    page = tmp_path / "p.html"
    page.write_text("<p>x</p>")
    t0 = time.monotonic()
    with pytest.raises(IdckitError, match=r"did not finish within 1 s[\s\S]*starting"):
        browser.inspect(page, timeout=1)
    assert time.monotonic() - t0 < 10, "waited for the browser's child instead of killing it"
    stat = Path(f"/proc/{(tmp_path / 'child').read_text().strip()}/stat")
    assert not stat.exists() or stat.read_text().split(") ")[1][0] in "ZX", "the browser's child survived"


def test_a_page_without_the_probe_output_is_an_error(tmp_path, monkeypatch):
    _fake_chromium(tmp_path, monkeypatch, "echo '<html><body>no probe</body></html>'")
    page = tmp_path / "p.html"
    page.write_text("<p>x</p>")
    with pytest.raises(IdckitError, match="load event never fired"):
        browser.inspect(page)


def test_missing_chromium_error_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("IDCKIT_CHROMIUM", str(tmp_path / "no-such-chromium"))
    with pytest.raises(MissingDependencyError, match="IDCKIT_CHROMIUM"):
        browser.find_chromium()
    monkeypatch.delenv("IDCKIT_CHROMIUM")
    monkeypatch.setattr(browser, "CANDIDATES", (str(tmp_path / "chromium"), "idckit-no-such-browser"))
    with pytest.raises(MissingDependencyError, match=r"make setup[\s\S]*apt-get install -y chromium"):
        browser.find_chromium()
