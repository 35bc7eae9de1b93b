"""Look at the HTML reports the way a visitor does: in a real (headless) Chromium.

``screenshot`` writes a PNG; ``inspect`` loads a page and reports what rendered: tables, every image and
whether it decoded, and the visible text (to catch raw tracebacks). No browser-automation dependency: the page is
copied next to itself with a small script that, on ``load``, writes a JSON summary into the DOM, and Chromium's
``--dump-dom`` hands the DOM back.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from idckit.errors import IdckitError, MissingDependencyError

# Offline, Chromium's background services fail to reach Google many times per start: switch them off.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--hide-scrollbars", "--mute-audio")

PROBE = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.map.call(document.images, function (im) {
    return {src: (im.getAttribute('src') || '').slice(0, 80), loaded: im.complete && im.naturalWidth > 0,
            width: im.naturalWidth, height: im.naturalHeight};
  });
  var out = {title: document.title, tables: document.getElementsByTagName('table').length, images: imgs,
             links: Array.prototype.map.call(document.links, function (a) { return a.getAttribute('href'); }),
             text: document.body ? document.body.innerText : ''};
  var pre = document.createElement('pre');
  pre.id = 'idckit-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""

TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\w+Error: ", re.MULTILINE)


@dataclass
class PageReport:
    title: str
    tables: int
    images: list[dict] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    text: str = ""

    @property
    def broken_images(self) -> list[dict]:
        return [im for im in self.images if not im["loaded"]]

    @property
    def tracebacks(self) -> list[str]:
        return [m.group(0) for m in TRACEBACK.finditer(self.text)]


def find_chromium() -> Path:
    candidates = [os.environ.get("IDCKIT_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                  shutil.which("chromium-browser"), shutil.which("google-chrome")]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    raise MissingDependencyError("headless Chromium is not installed", path="/usr/bin/chromium",
                                 fix="run `make setup` (installs Debian's chromium) or `apt-get install -y chromium`,"
                                     " or point IDCKIT_CHROMIUM at a Chrome/Chromium binary")


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="idckit-chromium-") as profile:
        cmd = [str(find_chromium()), *FLAGS, f"--user-data-dir={profile}", *args]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise IdckitError(f"Chromium did not finish within {timeout:.0f} s", fix="retry; check `chromium --version`") from exc
    if res.returncode != 0:
        raise IdckitError(f"Chromium failed (exit {res.returncode}): {res.stderr.strip()[-800:]}")
    return res


def screenshot(html: str | Path, png: str | Path, *, width: int = 1280, height: int = 900,
               timeout: float = 60) -> Path:
    """A PNG of ``html`` as Chromium renders it in a ``width`` x ``height`` window."""
    html, png = Path(html).resolve(), Path(png).resolve()
    if not html.is_file():
        raise IdckitError("no such page", path=html, fix="run `make reproduce` to write the reports")
    png.parent.mkdir(parents=True, exist_ok=True)
    tmp = png.with_name(f".{png.name}.tmp.png")
    _run([f"--screenshot={tmp}", f"--window-size={width},{height}", "--virtual-time-budget=5000",
          html.as_uri()], timeout)
    if not tmp.is_file():
        raise IdckitError("Chromium exited without writing the screenshot", path=png)
    os.replace(tmp, png)
    return png


def inspect(html: str | Path, *, timeout: float = 60) -> PageReport:
    """What a visitor's browser renders of ``html`` (tables, images and whether they loaded, visible text)."""
    html = Path(html).resolve()
    if not html.is_file():
        raise IdckitError("no such page", path=html, fix="run `make reproduce` to write the reports")
    source = html.read_text(encoding="utf-8")
    probed = source.replace("</body>", PROBE + "</body>") if "</body>" in source else source + PROBE
    # the copy sits beside the original so relative links and images resolve the same way
    fd, tmp = tempfile.mkstemp(prefix=".idckit-probe-", suffix=".html", dir=html.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(probed)
        dom = _run(["--dump-dom", "--virtual-time-budget=5000", Path(tmp).as_uri()], timeout).stdout
    finally:
        Path(tmp).unlink(missing_ok=True)
    m = re.search(r'<pre id="idckit-probe">(.*?)</pre>', dom, re.DOTALL)
    if not m:
        raise IdckitError("the page's load event never fired in Chromium (no probe output)", path=html)
    import html as html_lib

    data = json.loads(html_lib.unescape(m.group(1)))
    return PageReport(title=data["title"], tables=data["tables"], images=data["images"],
                      links=[link for link in data["links"] if link], text=data["text"])
