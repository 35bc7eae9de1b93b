"""Look at the HTML reports the way a visitor does: in a real (headless) Chromium.

``screenshot`` writes a PNG; ``inspect`` loads a page and reports what rendered: tables, every image and
whether it decoded, table cells that say "...Error", stderr blocks, and the visible text (to catch raw
tracebacks). No browser-automation dependency (the DevTools protocol would need a websocket client): a copy of
the page, in a temporary directory with a ``<base href>`` pointing back at the original's directory (so relative
links and images resolve as they do for the original), gets a small script that on ``load`` writes a JSON
summary into the DOM, and Chromium's ``--dump-dom`` hands the DOM back. Nothing is written next to the reports.

Chromium runs offline and deterministically: background services are switched off, and every host name fails
to resolve, so a report is judged by what it shows without a network (nbconvert's CDN scripts never load).
Chromium prints harmless errors on stderr offline; only its exit status, a timeout or a missing output counts.
"""
from __future__ import annotations

import html as html_lib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from idckit.errors import IdckitError, MissingDependencyError

# Where Chromium is looked for, after $IDCKIT_CHROMIUM (Debian's package installs /usr/bin/chromium).
CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")

# Offline, Chromium's background services fail to reach Google many times per start: switch them off.
# MAP * ~NOTFOUND makes every host lookup fail at once, so pages render the same with or without a network.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--hide-scrollbars", "--mute-audio",
         "--host-resolver-rules=MAP * ~NOTFOUND",
         # Debian's launcher adds this only when its /dev/shm size test works; containers often have 64 MB there
         "--disable-dev-shm-usage")

# The tallest full-page screenshot we take (Chromium's compositor limit is 16384 px).
MAX_HEIGHT = 16384

PROBE = """<script>
window.addEventListener('load', function () {
  var map = Array.prototype.map, filter = Array.prototype.filter;
  var imgs = map.call(document.images, function (im) {
    return {src: (im.getAttribute('src') || '').slice(0, 80), loaded: im.complete && im.naturalWidth > 0,
            width: im.naturalWidth, height: im.naturalHeight};
  });
  var cells = filter.call(document.querySelectorAll('td, th'), function (c) {
    return /Traceback|\\b\\w*(Error|Exception)\\b/.test(c.innerText);
  });
  var stderr = document.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]');
  var root = document.documentElement;
  var cards = map.call(document.querySelectorAll('.idckit-card'), function (c) {
    var r = c.getBoundingClientRect();
    return {id: c.id, top: r.top + window.scrollY, bottom: r.bottom + window.scrollY, left: r.left, right: r.right};
  });
  var out = {title: document.title, cards: cards, tables: document.getElementsByTagName('table').length, images: imgs,
             links: map.call(document.links, function (a) { return a.getAttribute('href'); }),
             error_cells: map.call(cells, function (c) { return c.innerText.slice(0, 200); }),
             stderr_blocks: stderr.length,
             width: Math.ceil(Math.max(root.getBoundingClientRect().width, root.scrollWidth)),
             height: Math.ceil(root.getBoundingClientRect().height),
             text: document.body ? document.body.innerText : ''};
  var pre = document.createElement('pre');
  pre.id = 'idckit-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""

# What a raw Python error looks like in visible text: IPython prints "ValueError   Traceback (most recent call
# last)" and ends with "ValueError: message"; plain Python starts with "Traceback (most recent call last):".
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\w*(?:Error|Exception): ", re.MULTILINE)


@dataclass
class PageReport:
    """What Chromium rendered of one page."""

    title: str
    tables: int
    images: list[dict] = field(default_factory=list)  # {src (first 80 chars), loaded, width, height}
    links: list[str] = field(default_factory=list)  # href attributes as written
    error_cells: list[str] = field(default_factory=list)  # td/th whose text names an Error/Exception
    stderr_blocks: int = 0  # notebook stderr outputs (warnings, progress bars) shown on the page
    width: int = 0  # the document's size in CSS pixels (its content, not the window)
    height: int = 0
    text: str = ""  # document.body.innerText
    cards: list[dict] = field(default_factory=list)  # each .idckit-card's {id, top, bottom, left, right}, CSS pixels

    @property
    def broken_images(self) -> list[dict]:
        return [im for im in self.images if not im["loaded"]]

    @property
    def tracebacks(self) -> list[str]:
        return [m.group(0) for m in TRACEBACK.finditer(self.text)]


def find_chromium() -> Path:
    """$IDCKIT_CHROMIUM if set (it must exist: a typo should not fall back silently), else the first of
    ``CANDIDATES`` that is an executable file or on PATH."""
    override = os.environ.get("IDCKIT_CHROMIUM")
    if override:
        found = shutil.which(override)
        if not found:
            raise MissingDependencyError("IDCKIT_CHROMIUM does not name an executable Chromium", path=override,
                                         fix="point IDCKIT_CHROMIUM at a Chrome/Chromium binary, or unset it")
        return Path(found)
    for c in CANDIDATES:
        found = shutil.which(c)
        if found:
            return Path(found)
    raise MissingDependencyError("headless Chromium is not installed", path="/usr/bin/chromium",
                                 fix="run `make setup` (installs Debian's chromium) or `apt-get install -y chromium`,"
                                     " or point IDCKIT_CHROMIUM at a Chrome/Chromium binary")


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Chromium with the offline flags and a fresh, empty profile that is deleted afterwards.

    Chromium runs in its own process group: Debian's launcher is a shell script that does not ``exec``, so on a
    timeout the whole group (launcher, browser, renderers) is killed, not only the script.
    """
    exe = find_chromium()
    with tempfile.TemporaryDirectory(prefix="idckit-chromium-") as profile:
        cmd = [str(exe), *FLAGS, f"--user-data-dir={profile}", *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise IdckitError(f"Chromium did not finish within {timeout:.0f} s; its stderr ends:\n{err.strip()[-800:]}",
                              path=exe, fix=f"check that `{exe} --headless --dump-dom about:blank` works") from None
    if proc.returncode != 0:
        raise IdckitError(f"Chromium failed (exit {proc.returncode}); its stderr ends:\n{err.strip()[-800:]}",
                          path=exe, fix=f"check that `{exe} --headless --dump-dom about:blank` works")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _page(html: str | Path) -> Path:
    html = Path(html).resolve()
    if not html.is_file():
        raise IdckitError("no such page", path=html, fix="run `make reproduce` to write the reports")
    return html


def screenshot(html: str | Path, png: str | Path, *, width: int = 1280, height: int = 900,
               full_page: bool = False, timeout: float = 60) -> Path:
    """A PNG of ``html`` as Chromium renders it in a ``width`` x ``height`` window, written atomically.

    ``full_page`` makes the window exactly as tall as the document's content (measured first by ``inspect`` at
    ``width``; at most ``MAX_HEIGHT``), so the PNG shows the whole page and no empty window below it.
    """
    html, png = _page(html), Path(png).resolve()
    if full_page:
        height = min(max(inspect(html, width=width, height=height, timeout=timeout).height, 1), MAX_HEIGHT)
    png.parent.mkdir(parents=True, exist_ok=True)
    tmp = png.with_name(f".{png.stem}.tmp-{os.getpid()}.png")
    try:
        _run([f"--screenshot={tmp}", f"--window-size={width},{height}", "--virtual-time-budget=5000",
              html.as_uri()], timeout)
        if not tmp.is_file():
            raise IdckitError("Chromium exited without writing the screenshot", path=png)
        os.replace(tmp, png)
    finally:
        tmp.unlink(missing_ok=True)
    return png


def _with_probe(source: str, base: str) -> str:
    """The page with ``<base href=base>`` first in its head (after any doctype, so the rendering mode does not
    change) and the probe script at its very end (the parser puts it in the body)."""
    tag = f'<base href="{html_lib.escape(base)}">'
    m = re.search(r"<head\b[^>]*>", source, re.IGNORECASE) or re.search(r"<!doctype[^>]*>", source, re.IGNORECASE)
    source = source[:m.end()] + tag + source[m.end():] if m else tag + source
    return source + PROBE


def inspect(html: str | Path, *, width: int = 1280, height: int = 900, timeout: float = 60) -> PageReport:
    """What a visitor's browser renders of ``html``: tables, images and whether they decoded, cells naming an
    error, stderr blocks, the document size and the visible text."""
    html = _page(html)
    probed = _with_probe(html.read_text(encoding="utf-8"), html.parent.as_uri() + "/")
    with tempfile.TemporaryDirectory(prefix="idckit-probe-") as tmp:
        copy = Path(tmp) / html.name
        copy.write_text(probed, encoding="utf-8")
        dom = _run(["--dump-dom", "--virtual-time-budget=5000", f"--window-size={width},{height}", copy.as_uri()],
                   timeout).stdout
    m = re.search(r'<pre id="idckit-probe">(.*?)</pre>', dom, re.DOTALL)
    if not m:
        raise IdckitError("the page's load event never fired in Chromium (no probe output in the DOM)", path=html)
    data = json.loads(html_lib.unescape(m.group(1)))
    return PageReport(title=data["title"], tables=data["tables"], images=data["images"],
                      links=[link for link in data["links"] if link], error_cells=data["error_cells"],
                      stderr_blocks=data["stderr_blocks"], width=data["width"], height=data["height"],
                      text=data["text"], cards=data.get("cards", []))
