"""Draw a SynthBirds bird (a species' attributes + one individual's photo conditions) with PIL in a few milliseconds.

The bird is built in its own frame (body length about 1, facing right, y up) from flat shapes: legs and a perch
behind, tail, body with a breast patch and its pattern, a wing with its pattern and bars, a head whose base is the
nape colour with a crown cap and a face patch, eye ring, eye and beak. Patches are clipped to the shape they
sit on with masks. The frame is then mirrored (facing left), tilted, scaled (species size x individual scale) and
placed over a sky, foliage or water background, drawn at twice the output size and box-filtered down, then lit
(brightness, colour tint) and given sensor noise. Everything is a function of its arguments: no global random
state, no floating-point reductions whose order could change, so the bytes are reproducible.
"""
from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFilter

from idckit.data.synth.bird_species import PALETTE

SS = 2  # supersampling factor
SIZE_SCALE = {"small": 0.72, "medium": 0.86, "large": 1.0}
BODY_B = {"slender": 0.23, "plump": 0.32}
BEAK_L = {"short": 0.15, "medium": 0.26, "long": 0.4}
BEAK_W = {"thin": 0.03, "thick": 0.068}
TAIL_L = {"short": 0.28, "long": 0.52}
LEG_L = {"short": 0.15, "long": 0.31}
RING = {"white": "white", "yellow": "yellow"}


def _rgb(name: str, k: float = 1.0, towards: tuple[int, int, int] | None = None, t: float = 0.0):
    c = np.asarray(PALETTE[name], dtype=np.float64) * k
    if towards is not None:
        c = c * (1 - t) + np.asarray(towards, dtype=np.float64) * t
    return tuple(int(round(min(255.0, max(0.0, v)))) for v in c)


def _ellipse(cx, cy, a, b, rot_deg=0.0, n=40):
    t = np.linspace(0, 2 * np.pi, n, endpoint=False)
    x, y = a * np.cos(t), b * np.sin(t)
    r = math.radians(rot_deg)
    return np.stack([cx + x * math.cos(r) - y * math.sin(r), cy + x * math.sin(r) + y * math.cos(r)], axis=1)


def _background(kind: str, w: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, w, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :, None]
    jit = rng.uniform(-18, 18, size=3)
    if kind == "sky":
        top, bottom = np.array([62, 118, 204]) + jit, np.array([178, 208, 236]) + jit / 2
        img = top * (1 - y) + bottom * y + 10 * np.sin(2 * np.pi * (x * rng.uniform(0.5, 1.5) + rng.random()))
    elif kind == "water":
        top, bottom = np.array([46, 104, 138]) + jit, np.array([18, 58, 92]) + jit / 2
        phase = rng.random() * 2 * np.pi
        ripple = np.sin(2 * np.pi * y * rng.uniform(14, 24) + 1.5 * np.sin(2 * np.pi * x * 2 + phase))
        img = top * (1 - y) + bottom * y + 9 * ripple * (0.3 + y)
    else:  # foliage: blurred blobs of greens
        base = np.array([46, 92, 40]) + jit
        im = Image.new("RGB", (w, w), tuple(int(v) for v in np.clip(base, 0, 255)))
        d = ImageDraw.Draw(im)
        for _ in range(28):
            cx, cy, r = rng.uniform(0, w), rng.uniform(0, w), rng.uniform(0.05, 0.18) * w
            g = rng.uniform(0.5, 1.35)
            col = np.clip(np.array([54, 110, 44]) * g + rng.uniform(-12, 12, size=3), 0, 255)
            d.ellipse([cx - r, cy - r * 0.7, cx + r, cy + r * 0.7], fill=tuple(int(v) for v in col))
        return im.filter(ImageFilter.GaussianBlur(w / 48))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


class _Canvas:
    """Maps the bird's frame to pixels and draws filled shapes, optionally clipped to a mask."""

    def __init__(self, img: Image.Image, scale: float, cx: float, cy: float, tilt: float, flip: bool):
        self.img, self.s, self.cx, self.cy = img, scale, cx, cy
        self.cos, self.sin, self.flip = math.cos(math.radians(tilt)), math.sin(math.radians(tilt)), flip
        self.draw = ImageDraw.Draw(img)
        self.extent: list[np.ndarray] = []

    def px(self, pts) -> list[tuple[float, float]]:
        p = np.asarray(pts, dtype=np.float64).reshape(-1, 2)
        x, y = p[:, 0], p[:, 1]
        x, y = x * self.cos - y * self.sin, x * self.sin + y * self.cos
        if self.flip:
            x = -x
        out = np.stack([self.cx + x * self.s, self.cy - y * self.s], axis=1)
        self.extent.append(out)
        return [tuple(v) for v in out]

    def mask(self, pts) -> Image.Image:
        m = Image.new("L", self.img.size, 0)
        ImageDraw.Draw(m).polygon(self.px(pts), fill=255)
        return m

    def fill(self, pts, color, clip: Image.Image | None = None) -> None:
        if clip is None:
            self.draw.polygon(self.px(pts), fill=color)
        else:
            self.fill_all([pts], color, clip)

    def fill_all(self, shapes, color, clip: Image.Image) -> None:
        """Several shapes of one colour clipped to ``clip`` with a single paste (pastes dominate the time)."""
        polys = [np.asarray(self.px(pts)) for pts in shapes]
        allp = np.concatenate(polys)
        W, H = self.img.size
        x0, y0 = max(0, int(allp[:, 0].min()) - 1), max(0, int(allp[:, 1].min()) - 1)
        x1, y1 = min(W, int(allp[:, 0].max()) + 2), min(H, int(allp[:, 1].max()) + 2)
        if x1 <= x0 or y1 <= y0:
            return
        m = Image.new("L", (x1 - x0, y1 - y0), 0)
        d = ImageDraw.Draw(m)
        for p in polys:
            d.polygon([(x - x0, y - y0) for x, y in p], fill=255)
        box = (x0, y0, x1, y1)
        self.img.paste(color, box, ImageChops.multiply(m, clip.crop(box)))

    def line(self, pts, color, width: float) -> None:
        self.draw.line(self.px(pts), fill=color, width=max(1, int(round(width * self.s))))


def _beak(shape: str, bx: float, by: float, L: float, W: float) -> np.ndarray:
    if shape == "hooked":
        return np.array([(bx, by + W), (bx + 0.65 * L, by + 0.7 * W), (bx + L, by - 0.2 * W),
                         (bx + 0.88 * L, by - 1.6 * W - 0.02), (bx + 0.74 * L, by - 0.4 * W), (bx, by - W)])
    if shape == "curved":
        t = np.linspace(0, 1, 12)
        xs, ys, w = bx + L * t, by - 0.5 * L * t ** 2, W * (1 - t) + 0.004
        return np.concatenate([np.stack([xs, ys + w], 1), np.stack([xs, ys - w], 1)[::-1]])
    return np.array([(bx, by + W), (bx + L, by - 0.15 * W), (bx, by - W)])


def _tail(shape: str, length: float, ax: float, ay: float) -> np.ndarray:
    d = np.array([-math.cos(math.radians(22)), -math.sin(math.radians(22))])
    n = np.array([-d[1], d[0]])
    a = np.array([ax, ay])
    if shape == "forked":
        pts = [a + n * 0.09, a + d * length + n * 0.11, a + d * length * 0.68, a + d * length - n * 0.11,
               a - n * 0.09]
    elif shape == "rounded":
        arc = [a + d * length * 0.8 + (n * math.cos(t) + d * math.sin(t)) * 0.12
               for t in np.linspace(0.0, math.pi, 9)]
        pts = [a + n * 0.08, *arc, a - n * 0.08]
    else:  # pointed
        pts = [a + n * 0.09, a + d * length * 0.6 + n * 0.06, a + d * length, a + d * length * 0.6 - n * 0.06,
               a - n * 0.09]
    return np.array(pts)


def render_bird(attrs: dict, ind: dict, size: int = 128) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """``[size, size, 3]`` uint8 and the bird's bounding box ``(x, y, w, h)`` in output pixels."""
    w = size * SS
    # the background is smooth: draw it at the output size and upsample
    img = _background(ind["background"], size, ind["bg_seed"]).resize((w, w), Image.BILINEAR)
    rng = np.random.default_rng(ind["bg_seed"] + 1)
    scale = w * 0.44 * SIZE_SCALE[attrs["size"]] * ind["scale"]
    cv = _Canvas(img, scale, w * (0.5 + ind["dx"]), w * (0.52 + ind["dy"]), ind["tilt"], ind["facing"] == "left")

    # perch behind the feet
    leg = LEG_L[attrs["leg_length"]]
    foot_y = -0.2 - leg
    perch = [(-1.6, foot_y - 0.03), (1.6, foot_y - 0.03 + rng.uniform(-0.12, 0.12))]
    cv.line(perch, (86 + int(rng.integers(-10, 10)), 58, 34), 0.07)
    cv.extent.pop()  # the perch is not the bird
    legc = _rgb(attrs["leg_color"])
    for hx in (0.06, -0.06):
        cv.line([(hx, -0.15), (hx + 0.02, foot_y)], legc, 0.025)
        cv.line([(hx - 0.05, foot_y), (hx + 0.08, foot_y)], legc, 0.02)

    cv.fill(_tail(attrs["tail_shape"], TAIL_L[attrs["tail_length"]], -0.38, 0.0), _rgb(attrs["wing_color"], 0.85))

    body = _ellipse(0.0, 0.0, 0.46, BODY_B[attrs["body"]], 14)
    cv.fill(body, _rgb(attrs["belly_color"]))
    body_m = cv.mask(body)
    breast = _ellipse(0.3, 0.02, 0.27, 0.25)
    breast_c = attrs["breast_color"]
    cv.fill(breast, _rgb(breast_c), body_m)
    if attrs["breast_pattern"] != "plain":
        bm = ImageChops.multiply(cv.mask(breast), body_m)
        dark = _rgb(breast_c, 0.45) if breast_c not in ("black", "brown") else _rgb("white", 0.85)
        spots = attrs["breast_pattern"] == "spotted"
        cv.fill_all([_ellipse(0.16 + 0.09 * (k % 3) + 0.03 * (k // 3), -0.14 + 0.08 * (k // 3),
                              0.022 if spots else 0.012, 0.022 if spots else 0.04, 0 if spots else 15, 10)
                     for k in range(9)], dark, bm)

    wing = _ellipse(-0.1, 0.06, 0.35, 0.16, -10)
    wing_c = attrs["wing_color"]
    cv.fill(wing, _rgb(wing_c))
    wm = cv.mask(wing)
    if attrs["wing_pattern"] == "spotted":
        light = _rgb(wing_c, 1.0, (245, 245, 240), 0.6)
        cv.fill_all([_ellipse(-0.34 + 0.07 * (k % 5) + 0.03 * (k // 5), 0.1 - 0.08 * (k // 5), 0.02, 0.02, 0, 10)
                     for k in range(10)], light, wm)
    elif attrs["wing_pattern"] == "striped":
        dark = _rgb(wing_c, 0.45) if wing_c != "black" else _rgb("gray")
        cv.fill_all([[(x, 0.25), (x + 0.035, 0.25), (x + 0.005, -0.15), (x - 0.03, -0.15)]
                     for x in (-0.38, -0.28, -0.18, -0.08)], dark, wm)
    if attrs["wing_bars"]:
        cv.fill_all([[(x, 0.26), (x + 0.035, 0.26), (x + 0.005, -0.12), (x - 0.03, -0.12)] for x in (0.02, -0.08)],
                    _rgb("white"), wm)

    head = _ellipse(0.43, 0.25, 0.165, 0.16)
    cv.fill(head, _rgb(attrs["nape_color"]))
    hm = cv.mask(head)
    cv.fill(_ellipse(0.45, 0.36, 0.17, 0.1), _rgb(attrs["crown_color"]), hm)
    cv.fill(_ellipse(0.54, 0.17, 0.1, 0.085), _rgb(breast_c), hm)
    if attrs["eye_ring"] != "none":
        cv.fill(_ellipse(0.5, 0.27, 0.058, 0.058, 0, 16), _rgb(RING[attrs["eye_ring"]]))
    cv.fill(_ellipse(0.5, 0.27, 0.03, 0.03, 0, 16), (12, 12, 14))
    cv.fill(_ellipse(0.508, 0.278, 0.009, 0.009, 0, 8), (230, 230, 230))
    cv.fill(_beak(attrs["beak_shape"], 0.56, 0.23, BEAK_L[attrs["beak_length"]], BEAK_W[attrs["beak_width"]]),
            _rgb(attrs["beak_color"]))

    pts = np.concatenate(cv.extent) / SS
    x0, y0 = np.clip(pts.min(0), 0, size)
    x1, y1 = np.clip(pts.max(0), 0, size)
    out = img.resize((size, size), Image.BOX)
    arr = np.asarray(out, dtype=np.float32)
    arr = arr * np.float32(ind["light"]) * (1.0 + np.asarray(ind["tint"], dtype=np.float32))
    arr += rng.standard_normal(size=arr.shape, dtype=np.float32) * np.float32(ind["noise"] * 255.0)
    bbox = (round(float(x0), 1), round(float(y0), 1), round(float(x1 - x0), 1), round(float(y1 - y0), 1))
    return np.clip(np.rint(arr), 0, 255).astype(np.uint8), bbox
