"""SynthIER: procedural photos, real PIL/numpy edits and raw requests, in the Image-Editing-Request layout.

Image-Editing-Request pairs a photo posted for editing with an edit somebody made, and the request that asked
for it ("take the people out of the back in the photo"). Here the before image is a small procedural scene,
a landscape (sky, sun, clouds, mountains, hills, lake, trees, house, boat) or a room (wall, floor, window,
sofa, table, lamp, plant, picture, rug), drawn with PIL and given a little lens blur and sensor noise. The after
image is that photo put through one edit (two for a quarter of the pairs) made with PIL and numpy: brightness,
contrast, saturation (incl. black and white), a colour tint, a crop, a flip or rotation, blur or sharpen,
removing an object by inpainting the background around it, added text, a frame, or a vignette. Requests are raw
English with mixed case and punctuation, drawn from several phrasings per edit ("Make the picture brighter.",
"please crop out the left side"), 1 per training pair and 3 (independent annotators) per valid/test pair.

Written (see :mod:`idckit.data.editing_request`): ``train.json``, ``valid.json``, ``test.json`` (indent 4,
exactly ``img0``, ``img1``, ``sents``, ``uid``) and ``images/`` with ``Synth.com_<post>_<post>.<ext>`` (before)
and ``Synth.com_<post>_<comment>.<ext>`` (after), extensions mixed like the real release (jpg, png, JPG, jpeg,
gif) and image sizes varied (crops and rotations change them). Splits follow the real 3,061 / 383 / 495. Extra:

- ``scene_descriptions.json``: ``{image file: "there is a lake , a pine tree and a red frame"}`` for every image
  (objects left to right, then what the edit left visible: a frame, text, a tint, ...): single-image text to
  pre-train a stand-in CLIP;
- ``edits.json``: ``{uid: [{"op": ..., ...}]}``, the edits actually applied;
- ``synth_info.json``: the marker (generator, arguments, counts).

Every pair draws from ``np.random.default_rng([seed, index])``, so the bytes do not depend on ``workers``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter, ImageFont, ImageOps
from tqdm.auto import tqdm

from idckit.data.synth import writing

GENERATOR_VERSION = "synth-editing-request/1"
SPLIT_FRACTIONS = {"train": 0.777, "val": 0.097, "test": 0.126}    # 3,061 / 383 / 495 pairs
REQUESTS_PER_PAIR = {"train": 1, "val": 3, "test": 3}
SIZES = ((256, 192), (224, 224), (192, 256), (288, 192), (240, 180))
EXTENSIONS = ("jpg", "png", "JPG", "jpeg", "gif")
EXTENSION_P = (0.6, 0.2, 0.08, 0.08, 0.04)
OPS = ("brightness", "contrast", "saturation", "tint", "crop", "rotate", "blur", "remove", "text", "frame",
       "vignette")
COLOURS = {"red": (200, 30, 30), "white": (245, 245, 245), "black": (15, 15, 15), "blue": (30, 60, 190),
           "yellow": (240, 210, 40), "green": (40, 150, 60), "pink": (240, 130, 180)}
TINTS = {"warm": (255, 160, 60), "cool": (70, 130, 255), "sepia": (160, 120, 70), "green": (80, 200, 90),
         "purple": (160, 80, 200)}
WORDS = ("SALE", "Hello", "LOL", "2019", "Happy Birthday", "WOW", "Summer", "Home", "Peace", "Nope")


# -- the before photo -------------------------------------------------------------------------------------
class _Canvas:
    """A PIL image plus one mask per removable object, drawn together."""

    def __init__(self, size, colour):
        self.img = Image.new("RGB", size, colour)
        self.draw = ImageDraw.Draw(self.img, "RGBA")
        self.objects: list[dict] = []
        self.size = size

    def thing(self, name: str, shapes, removable: bool = True) -> None:
        """Draw ``shapes`` [(method, xy, kwargs)] and record the object (with its mask if removable)."""
        mask = Image.new("L", self.size, 0) if removable else None
        md = ImageDraw.Draw(mask) if removable else None
        xs = []
        for method, xy, kw in shapes:
            getattr(self.draw, method)(xy, **kw)
            if md is not None:
                mkw = {k: (255 if k in ("fill", "outline") else v) for k, v in kw.items()}
                getattr(md, method)(xy, **mkw)
            flat = np.asarray(xy, dtype=float).reshape(-1, 2)
            xs.extend(flat[:, 0])
        self.objects.append({"name": name, "x": float(np.mean(xs)), "mask": mask})


def _gradient(size, top, bottom) -> np.ndarray:
    w, h = size
    t = np.linspace(0, 1, h, dtype=np.float32)[:, None, None]
    return (np.asarray(top, np.float32) * (1 - t) + np.asarray(bottom, np.float32) * t) * np.ones((1, w, 1), np.float32)


def landscape(size, rng) -> _Canvas:
    w, h = size
    sky = [((110, 160, 230), (200, 225, 245)), ((240, 150, 90), (250, 210, 150)), ((150, 160, 170), (210, 212, 215))]
    top, bottom = sky[int(rng.integers(len(sky)))]
    c = _Canvas(size, (0, 0, 0))
    c.img.paste(Image.fromarray(_gradient(size, top, bottom).astype(np.uint8)))
    horizon = int(h * rng.uniform(0.45, 0.6))
    if rng.random() < 0.6:
        x, y, r = rng.uniform(0.15, 0.85) * w, rng.uniform(0.08, 0.25) * h, rng.uniform(0.05, 0.08) * w
        c.thing("sun", [("ellipse", [x - r, y - r, x + r, y + r], {"fill": (255, 235, 150)})])
    for _ in range(int(rng.integers(0, 3))):
        x, y, r = rng.uniform(0.1, 0.9) * w, rng.uniform(0.1, 0.3) * h, rng.uniform(0.06, 0.1) * w
        c.thing("cloud", [("ellipse", [x - r * k, y - r * 0.5, x + r * k, y + r * 0.5], {"fill": (250, 250, 252, 220)})
                          for k in (1.0, 0.7)] + [("ellipse", [x - r * 0.5, y - r * 0.9, x + r * 0.5, y + r * 0.2],
                                                   {"fill": (250, 250, 252, 220)})])
    if rng.random() < 0.8:
        pts = [(0, horizon)] + [(x, horizon - rng.uniform(0.1, 0.3) * h) for x in np.linspace(0, w, 6)] + [(w, horizon)]
        c.thing("mountains", [("polygon", pts, {"fill": (100, 110, 140)})], removable=False)
    c.draw.rectangle([0, horizon, w, h], fill=(80, 140, 70))
    lake = rng.random() < 0.5
    if lake:
        ly = horizon + (h - horizon) * rng.uniform(0.15, 0.3)
        c.draw.rectangle([0, ly, w, h - (h - horizon) * 0.25], fill=(60, 110, 170))
        for _ in range(12):
            x, y = rng.uniform(0, w), rng.uniform(ly + 2, h - (h - horizon) * 0.25 - 2)
            c.draw.line([x, y, x + rng.uniform(5, 15), y], fill=(150, 190, 230, 150))
        if rng.random() < 0.6:
            bx, by = rng.uniform(0.2, 0.8) * w, ly + (h - horizon) * 0.2
            s = w * 0.05
            c.thing("boat", [("polygon", [(bx - s, by), (bx + s, by), (bx + s * 0.7, by + s * 0.4),
                                          (bx - s * 0.7, by + s * 0.4)], {"fill": (150, 60, 40)}),
                             ("polygon", [(bx, by - s * 1.2), (bx, by - 1), (bx + s * 0.7, by - 1)],
                              {"fill": (240, 240, 235)})])
    if rng.random() < 0.5:
        hx, hy, s = rng.uniform(0.15, 0.85) * w, horizon + (h - horizon) * 0.12, w * rng.uniform(0.07, 0.1)
        wall = tuple(int(v) for v in rng.choice([(220, 210, 190), (200, 80, 60), (240, 240, 230)]))
        c.thing("house", [("rectangle", [hx - s, hy - s, hx + s, hy], {"fill": wall}),
                          ("polygon", [(hx - s * 1.2, hy - s), (hx + s * 1.2, hy - s), (hx, hy - s * 1.8)],
                           {"fill": (110, 50, 40)}),
                          ("rectangle", [hx - s * 0.2, hy - s * 0.6, hx + s * 0.2, hy], {"fill": (80, 50, 30)})])
    for _ in range(int(rng.integers(1, 4))):
        tx, ty = rng.uniform(0.05, 0.95) * w, h - rng.uniform(0.02, 0.2) * h
        s = w * rng.uniform(0.05, 0.08)
        if rng.random() < 0.5:
            c.thing("pine tree", [("rectangle", [tx - s * 0.12, ty - s * 0.5, tx + s * 0.12, ty],
                                   {"fill": (90, 60, 40)}),
                                  ("polygon", [(tx - s, ty - s * 0.4), (tx + s, ty - s * 0.4), (tx, ty - s * 3)],
                                   {"fill": (30, 90, 45)})])
        else:
            c.thing("tree", [("rectangle", [tx - s * 0.15, ty - s * 1.2, tx + s * 0.15, ty], {"fill": (100, 70, 45)}),
                             ("ellipse", [tx - s, ty - s * 3, tx + s, ty - s], {"fill": (60, 130, 55)})])
    return c


def room(size, rng) -> _Canvas:
    w, h = size
    wall = np.asarray(rng.choice([(230, 220, 200), (200, 215, 225), (235, 200, 190), (210, 220, 200)]), np.float32)
    c = _Canvas(size, (0, 0, 0))
    c.img.paste(Image.fromarray(_gradient(size, wall * 0.8, wall).clip(0, 255).astype(np.uint8)))
    floor = int(h * rng.uniform(0.62, 0.72))
    wood = tuple(int(v) for v in rng.choice([(150, 100, 60), (190, 150, 100), (120, 80, 50)]))
    c.draw.rectangle([0, floor, w, h], fill=wood)
    for y in range(floor + 6, h, 9):
        c.draw.line([0, y, w, y], fill=tuple(int(v * 0.8) for v in wood))
    if rng.random() < 0.7:
        x0, x1 = sorted(rng.uniform(0.05, 0.95, 2) * w)
        x1 = max(x1, x0 + w * 0.2)
        c.thing("window", [("rectangle", [x0, h * 0.12, x1, h * 0.45],
                            {"fill": (150, 200, 240), "outline": (250, 250, 250), "width": 4}),
                           ("line", [(x0 + x1) / 2, h * 0.12, (x0 + x1) / 2, h * 0.45],
                            {"fill": (250, 250, 250), "width": 3})],
                removable=False)
    if rng.random() < 0.6:
        px, s = rng.uniform(0.15, 0.85) * w, w * 0.09
        art = tuple(int(v) for v in rng.integers(40, 230, 3))
        c.thing("picture", [("rectangle", [px - s, h * 0.2, px + s, h * 0.2 + s * 1.4], {"fill": (60, 40, 30)}),
                            ("rectangle", [px - s * 0.8, h * 0.2 + s * 0.2, px + s * 0.8, h * 0.2 + s * 1.2],
                             {"fill": art})])
    if rng.random() < 0.5:
        c.draw.ellipse([w * 0.15, floor + (h - floor) * 0.35, w * 0.85, h * 0.98],
                       fill=tuple(int(v) for v in rng.integers(60, 200, 3)))
    sofa = tuple(int(v) for v in rng.choice([(120, 40, 40), (60, 80, 130), (90, 90, 90), (150, 130, 90)]))
    sx = rng.uniform(0.25, 0.75) * w
    s = w * 0.22
    c.thing("sofa", [("rounded_rectangle", [sx - s, floor - s * 0.55, sx + s, floor + s * 0.15],
                      {"fill": sofa, "radius": 6}),
                     ("rounded_rectangle", [sx - s * 1.1, floor - s * 0.3, sx - s * 0.85, floor + s * 0.2],
                      {"fill": tuple(int(v * 0.8) for v in sofa), "radius": 4}),
                     ("rounded_rectangle", [sx + s * 0.85, floor - s * 0.3, sx + s * 1.1, floor + s * 0.2],
                      {"fill": tuple(int(v * 0.8) for v in sofa), "radius": 4})])
    side = -1 if sx > w / 2 else 1
    if rng.random() < 0.7:
        lx = sx + side * s * 1.45
        c.thing("lamp", [("line", [lx, floor + s * 0.1, lx, floor - s * 0.9], {"fill": (40, 40, 40), "width": 3}),
                         ("polygon", [(lx - s * 0.25, floor - s * 0.9), (lx + s * 0.25, floor - s * 0.9),
                                      (lx + s * 0.15, floor - s * 1.2), (lx - s * 0.15, floor - s * 1.2)],
                          {"fill": (250, 230, 170)})])
    if rng.random() < 0.7:
        px = sx - side * s * 1.45
        c.thing("plant", [("rectangle", [px - s * 0.15, floor - s * 0.1, px + s * 0.15, floor + s * 0.2],
                           {"fill": (170, 90, 60)}),
                          ("ellipse", [px - s * 0.3, floor - s * 0.7, px + s * 0.3, floor], {"fill": (40, 120, 50)})])
    if rng.random() < 0.5:
        tx = rng.uniform(0.3, 0.7) * w
        c.thing("table", [("rectangle", [tx - s * 0.5, floor + s * 0.3, tx + s * 0.5, floor + s * 0.4],
                           {"fill": (90, 60, 40)}),
                          ("rectangle", [tx - s * 0.4, floor + s * 0.4, tx - s * 0.33, floor + s * 0.7],
                           {"fill": (90, 60, 40)}),
                          ("rectangle", [tx + s * 0.33, floor + s * 0.4, tx + s * 0.4, floor + s * 0.7],
                           {"fill": (90, 60, 40)})])
    return c


def photo(rng) -> tuple[object, list[dict]]:
    """A before photo (PIL RGB) and its objects (name, centre x, mask or None), left to right."""
    size = SIZES[int(rng.integers(len(SIZES)))]
    c = landscape(size, rng) if rng.random() < 0.5 else room(size, rng)
    img = c.img.filter(ImageFilter.GaussianBlur(0.6))
    arr = np.asarray(img, np.float32) + rng.normal(0, 3.0, (size[1], size[0], 3))
    return Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8)), c.objects


# -- edits ---------------------------------------------------------------------------------------------------
def inpaint(arr: np.ndarray, mask: np.ndarray, rng, iterations: int = 20) -> np.ndarray:
    """Fill ``mask`` from its surroundings: row/column interpolation, then harmonic smoothing, then grain.

    A numpy stand-in for an image editor's content-aware fill: interpolation along rows carries the horizontal
    structure of these photos (horizon, floor, bands) across the hole (columns fill the rows with nothing
    known), a mostly horizontal smoothing removes the seams, and grain at the photo's noise level keeps the
    patch from looking painted.
    """
    out = arr.astype(np.float32).copy()
    m = mask.copy()
    for _ in range(2):                       # dilate: the object's anti-aliased rim goes too
        m = m | np.roll(m, 1, 0) | np.roll(m, -1, 0) | np.roll(m, 1, 1) | np.roll(m, -1, 1)
    if not m.any():
        return arr
    if m.all():
        raise ValueError("cannot inpaint a mask that covers the whole image")
    ys, xs = np.nonzero(m)
    y0, y1 = max(0, ys.min() - 1), min(m.shape[0], ys.max() + 2)
    x0, x1 = max(0, xs.min() - 1), min(m.shape[1], xs.max() + 2)
    sub, sm = out[y0:y1, x0:x1], m[y0:y1, x0:x1]
    fill = np.zeros_like(sub)
    weight = np.zeros(sm.shape, np.float32)
    for axis in (1, 0):                      # rows first; columns only where a whole row is masked
        s2, m2 = (sub, sm) if axis == 1 else (sub.transpose(1, 0, 2), sm.T)
        f2 = np.zeros_like(s2)
        w2 = np.zeros(m2.shape, np.float32)
        idx = np.arange(m2.shape[1])
        for r in range(m2.shape[0]):
            known = ~m2[r]
            if known.any() and m2[r].any():
                for ch in range(3):
                    f2[r, :, ch] = np.interp(idx, idx[known], s2[r, known, ch])
                w2[r] = 1.0
        if axis == 0:
            f2, w2 = f2.transpose(1, 0, 2), w2.T
            w2 = w2 * (weight == 0)
        fill += f2 * w2[..., None]
        weight += w2
    sub[sm] = (fill[sm] / np.maximum(weight[sm], 1e-6)[:, None])
    for _ in range(iterations):             # anisotropic like the fill: smooth seams, keep band edges
        avg = (np.roll(sub, 1, 0) + np.roll(sub, -1, 0) + 3 * (np.roll(sub, 1, 1) + np.roll(sub, -1, 1))) / 8
        sub[sm] = avg[sm]
    sub[sm] += rng.normal(0, 3.0, (int(sm.sum()), 3))
    out[y0:y1, x0:x1] = sub
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _font(size: int):
    return ImageFont.load_default(size=size)   # the font bundled with Pillow: same glyphs on every machine


def apply_edit(img, op: str, rng, target: dict | None = None) -> tuple[object, dict]:
    """``img`` with edit ``op`` applied (PIL in, PIL out) and the record of what was done.

    ``target`` is the object (with its mask) that ``remove`` inpaints away.
    """
    w, h = img.size
    if op == "brightness":
        up = bool(rng.random() < 0.5)
        f = float(rng.uniform(1.35, 1.7) if up else rng.uniform(0.45, 0.7))
        return ImageEnhance.Brightness(img).enhance(f), {"op": op, "direction": "up" if up else "down", "factor": f}
    if op == "contrast":
        up = bool(rng.random() < 0.5)
        f = float(rng.uniform(1.5, 2.0) if up else rng.uniform(0.35, 0.6))
        return ImageEnhance.Contrast(img).enhance(f), {"op": op, "direction": "up" if up else "down", "factor": f}
    if op == "saturation":
        kind = str(rng.choice(["grey", "down", "up"]))
        f = {"grey": 0.0, "down": float(rng.uniform(0.3, 0.5)), "up": float(rng.uniform(1.7, 2.3))}[kind]
        return ImageEnhance.Color(img).enhance(f), {"op": op, "direction": kind, "factor": f}
    if op == "tint":
        name = str(rng.choice(sorted(TINTS)))
        a = float(rng.uniform(0.25, 0.4))
        base = ImageOps.grayscale(img).convert("RGB") if name == "sepia" else img
        return Image.blend(base, Image.new("RGB", img.size, TINTS[name]), a), {"op": op, "tint": name, "alpha": a}
    if op == "crop":
        side = str(rng.choice(["left", "right", "top", "bottom", "centre"]))
        f = float(rng.uniform(0.2, 0.35))
        box = {"left": (int(w * f), 0, w, h), "right": (0, 0, int(w * (1 - f)), h), "top": (0, int(h * f), w, h),
               "bottom": (0, 0, w, int(h * (1 - f))),
               "centre": (int(w * f / 2), int(h * f / 2), int(w * (1 - f / 2)), int(h * (1 - f / 2)))}[side]
        return img.crop(box), {"op": op, "side": side, "fraction": f}
    if op == "rotate":
        kind = str(rng.choice(["mirror", "mirror", "upside down", "left", "right", "slight"]))
        if kind == "mirror":
            return ImageOps.mirror(img), {"op": op, "kind": kind}
        if kind == "upside down":
            return ImageOps.flip(img), {"op": op, "kind": kind}
        if kind in ("left", "right"):
            return img.transpose(Image.Transpose.ROTATE_90 if kind == "left" else Image.Transpose.ROTATE_270), \
                {"op": op, "kind": kind}
        angle = float(rng.choice([-1, 1]) * rng.uniform(4, 8))
        rotated = img.rotate(angle, resample=Image.BICUBIC, expand=False)
        m = int(max(w, h) * np.sin(np.radians(abs(angle)))) + 1       # crop the empty corners away
        return rotated.crop((m, m, w - m, h - m)), {"op": op, "kind": kind, "angle": angle}
    if op == "blur":
        if rng.random() < 0.6:
            r = float(rng.uniform(2.0, 3.5))
            return img.filter(ImageFilter.GaussianBlur(r)), {"op": op, "kind": "blur", "radius": r}
        return img.filter(ImageFilter.UnsharpMask(radius=2, percent=250, threshold=0)), {"op": op, "kind": "sharpen"}
    if op == "remove":
        arr = inpaint(np.asarray(img), np.asarray(target["mask"]) > 0, rng)
        return Image.fromarray(arr), {"op": op, "object": target["name"], "where": _where(target, w)}
    if op == "text":
        word = str(rng.choice(WORDS))
        colour = str(rng.choice(["white", "black", "red", "yellow"]))
        at = str(rng.choice(["top", "bottom", "middle"]))
        out = img.copy()
        d = ImageDraw.Draw(out)
        font = _font(max(12, int(h * 0.13)))
        tw = d.textlength(word, font=font)
        y = {"top": h * 0.06, "middle": h * 0.42, "bottom": h * 0.8}[at]
        d.text(((w - tw) / 2, y), word, font=font, fill=COLOURS[colour],
               stroke_width=1, stroke_fill=(0, 0, 0) if colour != "black" else (255, 255, 255))
        return out, {"op": op, "text": word, "colour": colour, "at": at}
    if op == "frame":
        colour = str(rng.choice(sorted(COLOURS)))
        b = int(min(w, h) * rng.uniform(0.05, 0.1))
        return ImageOps.expand(img.crop((b, b, w - b, h - b)), border=b, fill=COLOURS[colour]), \
            {"op": op, "colour": colour, "width": b}
    if op == "vignette":
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        r = np.sqrt(((xx - w / 2) / (w / 2)) ** 2 + ((yy - h / 2) / (h / 2)) ** 2) / np.sqrt(2)
        s = float(rng.uniform(0.6, 0.85))
        arr = np.asarray(img, np.float32) * (1 - s * np.clip(r, 0, 1) ** 2)[..., None]
        return Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8)), {"op": op, "strength": s}
    raise ValueError(f"unknown edit {op!r}")


_AT = {"top": "at the top", "bottom": "at the bottom", "middle": "in the middle"}


def _where(o: dict, width: int) -> str:
    return "left" if o["x"] < width / 3 else "right" if o["x"] > 2 * width / 3 else "middle"


# -- requests --------------------------------------------------------------------------------------------------
def _phrases(e: dict) -> list[str]:
    op = e["op"]
    if op == "brightness":
        if e["direction"] == "up":
            return ["Make the picture brighter", "brighten the image", "Increase the brightness",
                    "lighten up the photo", "make it lighter", "Brighten it up a bit", "The image needs to be brighter"]
        return ["Make the image darker", "darken the photo", "Reduce the brightness", "make it less bright",
                "Make the whole picture a little darker", "dim the image"]
    if op == "contrast":
        if e["direction"] == "up":
            return ["Increase the contrast", "add more contrast", "Boost the contrast of the picture",
                    "make the contrast stronger", "More contrast"]
        return ["Lower the contrast", "reduce contrast", "make the image look more flat", "Decrease the contrast",
                "tone down the contrast"]
    if op == "saturation":
        return {"grey": ["Make it black and white", "convert to grayscale", "Remove all the color",
                         "make the photo b&w", "Turn the picture black and white", "desaturate it completely"],
                "down": ["Tone down the colors", "desaturate the image", "make the colours less vivid",
                         "Reduce the saturation", "make it look more washed out"],
                "up": ["Make the colors pop", "increase the saturation", "more vibrant colors",
                       "Make the colours more vivid", "saturate the image"]}[e["direction"]]
    if op == "tint":
        return {"warm": ["Give it a warm tone", "add an orange tint", "make the picture warmer",
                         "Add a warm filter"],
                "cool": ["Make it look colder", "add a blue tint", "Give the image a cool blue filter",
                         "make the photo more blue"],
                "sepia": ["Make it look old", "add a sepia filter", "Give it a vintage sepia look",
                          "make the picture look like an old photo"],
                "green": ["Add a green tint", "make everything greener", "Give the photo a green filter"],
                "purple": ["Add a purple tint", "make it purple", "Give the image a purple hue"]}[e["tint"]]
    if op == "crop":
        s = e["side"]
        if s == "centre":
            return ["Zoom in on the center", "crop the image closer", "Crop tighter around the middle",
                    "zoom in a little", "Crop the edges off"]
        return [f"Crop out the {s} side", f"crop out the {s} side", f"cut off the {s} part of the image",
                f"Crop the picture so the {s} side is gone", f"remove the {s} portion of the photo",
                f"Crop the {s} edge"]
    if op == "rotate":
        k = e["kind"]
        return {"mirror": ["Flip the image horizontally", "mirror the picture", "flip it left to right",
                           "Mirror image this photo", "flip the photo"],
                "upside down": ["Flip it upside down", "turn the picture upside down", "Flip the image vertically"],
                "left": ["Rotate the image 90 degrees to the left", "turn the picture counterclockwise",
                         "Rotate it left"],
                "right": ["Rotate the image 90 degrees to the right", "turn the picture clockwise",
                          "Rotate it to the right"],
                "slight": ["Rotate the picture slightly", "tilt the image a bit", "Straighten the photo",
                           "rotate it a few degrees"]}[k]
    if op == "blur":
        if e["kind"] == "blur":
            return ["Blur the image", "make it blurry", "Add a blur effect", "soften the whole picture",
                    "Make the photo out of focus"]
        return ["Sharpen the photo", "make the image sharper", "Make it crisper", "sharpen it up",
                "Enhance the details"]
    if op == "remove":
        o, where = e["object"], e["where"]
        at = "in the middle" if where == "middle" else f"on the {where}"
        return [f"Remove the {o}", f"take the {o} out", f"Get rid of the {o} {at}",
                f"remove the {o} from the photo", f"Erase the {o}", f"I want the {o} {at} removed"]
    if op == "text":
        t, c = e["text"], e["colour"]
        return [f'Add the text "{t}"', f"write {t} {_AT[e['at']]}", f"Put the word {t} in {c} letters",
                f"add text that says {t}", f'Add "{t}" in {c}', f"Write '{t}' on the picture"]
    if op == "frame":
        c = e["colour"]
        return [f"Add a {c} border", f"put a {c} frame around the picture", f"Give it a thick {c} border",
                f"add a {c} frame", f"Frame the photo in {c}"]
    if op == "vignette":
        return ["Add a vignette", "darken the edges", "make the corners darker",
                "Add a dark vignette around the edges", "give it a vignette effect"]
    raise ValueError(op)


def request(edits: list[dict], rng) -> str:
    """One annotator's request for ``edits``: a phrasing per edit, joined, in one of a few raw writing styles."""
    parts = [str(rng.choice(_phrases(e))) for e in edits]
    text = parts[0]
    for p in parts[1:]:
        text += " and " + p[0].lower() + p[1:]
    style = rng.random()
    if parts[0].split()[0].lower() == "more":        # a bare noun phrase ("More contrast") takes no "Can you"
        style = 1.0
    if style < 0.08:
        text = "please " + text[0].lower() + text[1:]
    elif style < 0.18:
        text = "Can you " + text[0].lower() + text[1:] + "?"
    elif style < 0.26:
        text = "Could someone " + text[0].lower() + text[1:] + "?"
    if not text.endswith("?"):
        text += str(rng.choice([".", ".", "", "!", ".", "", ".", " please"], p=[.2, .2, .15, .1, .15, .1, .05, .05]))
    if rng.random() < 0.3 and text[0].isupper() and not text.startswith(("Can ", "Could ")):
        text = text[0].lower() + text[1:]
    return text


def describe(objects: list[dict], edits: list[dict] | None = None) -> str:
    """``there is A , B and C``: objects left to right, then what the edits left visible."""
    parts = [f"a {o['name']}" for o in sorted(objects, key=lambda o: o["x"])]
    for e in edits or []:
        op = e["op"]
        if op == "brightness":
            parts.append("a bright tone" if e["direction"] == "up" else "a dark tone")
        elif op == "contrast":
            parts.append("strong contrast" if e["direction"] == "up" else "flat contrast")
        elif op == "saturation":
            parts.append({"grey": "no colour", "down": "pale colours", "up": "vivid colours"}[e["direction"]])
        elif op == "tint":
            parts.append(f"a {e['tint']} tint")
        elif op == "blur":
            parts.append("a blurry look" if e["kind"] == "blur" else "sharp details")
        elif op == "text":
            parts.append(f"the word {e['text'].lower()}")
        elif op == "frame":
            parts.append(f"a {e['colour']} frame")
        elif op == "vignette":
            parts.append("dark corners")
    if not parts:
        return "there is a plain photo"
    return "there is " + (parts[0] if len(parts) == 1 else " , ".join(parts[:-1]) + " and " + parts[-1])


# -- one pair -------------------------------------------------------------------------------------------------
def _token(rng, n: int) -> str:
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
    return "".join(alphabet[int(i)] for i in rng.integers(0, 36, n))


def make_pair(job: tuple[int, int, int]) -> dict:
    seed, index, n_requests = job
    rng = np.random.default_rng([seed, index])
    before, objects = photo(rng)
    ops = [o for o in OPS if o != "remove" or any(ob["mask"] is not None for ob in objects)]
    first = str(rng.choice(ops))
    chosen = [first]
    if rng.random() < 0.25:
        # a second edit of another kind; geometric edits go last so the object positions of "remove" still hold
        second = str(rng.choice([o for o in ops if o not in (first, "remove")]))
        chosen.append(second)
    img, edits, kept = before, [], [dict(o) for o in objects]
    for op in chosen:
        target = None
        if op == "remove":
            removable = [o for o in kept if o["mask"] is not None]
            target = removable[int(rng.integers(len(removable)))]
        img, e = apply_edit(img, op, rng, target)
        edits.append(e)
        if op == "remove":
            kept.remove(target)
        elif op == "crop":
            kept = [o for o in kept if not _cropped_out(o, e, before.size[0])]
        elif op == "rotate" and e["kind"] == "mirror":
            for o in kept:
                o["x"] = before.size[0] - o["x"]
    post, comment = _token(rng, 6), _token(rng, 7)
    ext0 = str(rng.choice(EXTENSIONS, p=EXTENSION_P))
    ext1 = str(rng.choice(EXTENSIONS, p=EXTENSION_P))
    img0 = f"Synth.com_{post}_{post}.{ext0}"
    img1 = f"Synth.com_{post}_{comment}{'_2' if rng.random() < 0.1 else ''}.{ext1}"
    return {"index": index, "img0": img0, "img1": img1,
            "bytes0": writing.encode(before, ext0), "bytes1": writing.encode(img, ext1),
            "sents": [request(edits, rng) for _ in range(n_requests)],
            "edits": edits, "descriptions": (describe(objects), describe(kept, edits))}


def _cropped_out(o: dict, e: dict, width: int) -> bool:
    f = e["fraction"]
    return (e["side"] == "left" and o["x"] < width * f) or (e["side"] == "right" and o["x"] > width * (1 - f))


# -- the dataset ----------------------------------------------------------------------------------------------
def generate(out: str | Path, *, n_pairs: int | None = None, seed: int | None = None, workers: int | None = None,
             profile: str | None = None, overwrite: bool = False, progress: bool = True, force: bool = False) -> Path:
    """Write SynthIER to ``out`` (atomically); reuse it if it already holds the same arguments. ``force``: write
    beside entries the generator did not write (kept, never deleted). An argument left None is
    ``configs/synth_editing_request.json``'s at ``profile`` (None: the default profile)."""
    a = writing.from_profile("synth_editing_request", profile, pairs=n_pairs, seed=seed, workers=workers)
    n_pairs, seed, workers = a["pairs"], a["seed"], a["workers"]
    out = writing.check_common(Path(out), n_pairs, 12, workers, seed)
    info = {"synthetic": True, "generator": GENERATOR_VERSION, "pairs": n_pairs, "seed": seed}
    claim = writing.claim(out, "synth-ier", info, overwrite, force)
    if claim is None:
        return out
    splits = writing.split_ids(n_pairs, seed, SPLIT_FRACTIONS)
    split_of = {i: s for s, ids in splits.items() for i in ids}
    rows: dict[str, list[dict]] = {s: [] for s in splits}
    descriptions, edits = {}, {}
    with writing.staging(claim) as tmp:
        (tmp / "images").mkdir()
        jobs = [(seed, i, REQUESTS_PER_PAIR[split_of[i]]) for i in range(n_pairs)]
        for r in tqdm(writing.ordered_map(make_pair, jobs, workers), total=n_pairs, desc="SynthIER", unit="pair",
                      disable=not progress):
            uid = f"Synth_{r['index']}"
            (tmp / "images" / r["img0"]).write_bytes(r["bytes0"])
            (tmp / "images" / r["img1"]).write_bytes(r["bytes1"])
            descriptions[r["img0"]], descriptions[r["img1"]] = r["descriptions"]
            edits[uid] = r["edits"]
            rows[split_of[r["index"]]].append({"img0": r["img0"], "img1": r["img1"], "sents": r["sents"], "uid": uid})
        for s, name in (("train", "train.json"), ("val", "valid.json"), ("test", "test.json")):
            writing.write_json(tmp / name, rows[s], indent=4)
        counts = {s: {"pairs": len(v), "sentences": sum(len(e["sents"]) for e in v)} for s, v in rows.items()}
        writing.write_json(tmp / "scene_descriptions.json", descriptions)
        writing.write_json(tmp / "edits.json", edits)
        writing.write_json(tmp / writing.MARKER, {**info, "counts": counts}, indent=1)
    return out
