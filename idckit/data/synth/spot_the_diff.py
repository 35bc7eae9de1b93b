"""SynthSpot-the-Diff: fixed surveillance cameras over streets and parking lots, in the Spot-the-Diff layout.

Spot-the-Diff pairs two frames of a static VIRAT surveillance camera; annotators wrote what differs. Here a few
camera *sites* (buildings with windows, a sidewalk with kerbs, a road with lane marks, a parking lot with
painted bays, trees and the shadows of all of them, one sun direction per site) are drawn once per seed, and
every pair places 3-9 cars, people and bikes of varied colours on one site. The after frame differs by 1-3
object changes (appeared, gone, moved) or, for about 32 % of the pairs, only by light and sensor noise, which
gives about 30 % no-difference references as in the real set. 1-3 annotators (mostly one, as in the real
~1.1 entries per pair) write 1-4 short lower-case sentences without punctuation each; now and then an annotator
misses a change and writes that there is no difference, as real annotators do.

Written (see :mod:`idckit.data.spot_the_diff`): ``annotations/{train,val,test}.json`` (one entry per
annotator, in a seeded order, so readers must group by ``img_id``), ``resized_images/<id>.png`` and
``<id>_2.png`` at 224x224 with ids ``0..N-1`` un-padded, splits in the real proportions (8,566 / 1,493 /
1,270 pairs). Not written: ``<id>_diff.jpg`` (the kit does not read it). Extra files:

- ``scene_descriptions.json``: ``{image file: "there is a red car in the parking lot , a person in blue on the
  sidewalk and ..."}`` for every image, left to right: single-image text to pre-train a stand-in CLIP;
- ``changes.json``: ``{img_id: [{"change": "appeared"|"gone"|"moved", "object": ...}]}``, the truth behind
  the sentences (empty for no-change pairs);
- ``synth_info.json``: the marker (generator, arguments, counts).

Every pair draws from ``np.random.default_rng([seed, id])`` and every site from its own stream, so the bytes do
not depend on ``workers``.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm.auto import tqdm

from idckit.data.synth import writing
from idckit.errors import ConfigError

GENERATOR_VERSION = "synth-spot-the-diff/1"
SIZE = 224
SCALE = 2                        # drawn at 2x and downsampled: anti-aliased edges without an AA rasteriser
N_SITES = 6
SPLIT_FRACTIONS = {"train": 0.756, "val": 0.132, "test": 0.112}   # 8,566 / 1,493 / 1,270 pairs
NO_CHANGE_SHARE = 0.32
ANNOTATORS = (1, 2, 3)
ANNOTATOR_P = (0.88, 0.10, 0.02)  # real: 9,524 entries for 8,566 train pairs
MISS_P = 0.06                     # an annotator overlooks the change(s)

CAR_COLOURS = {"white": (236, 236, 232), "black": (28, 28, 32), "silver": (170, 174, 180), "grey": (110, 112, 116),
               "red": (178, 30, 32), "blue": (36, 70, 170), "green": (40, 110, 60), "yellow": (225, 190, 40),
               "maroon": (110, 30, 40), "orange": (220, 110, 30)}
SHIRT_COLOURS = {"red": (200, 40, 40), "blue": (40, 80, 200), "white": (240, 240, 240), "black": (30, 30, 30),
                 "yellow": (235, 205, 50), "green": (50, 150, 70), "orange": (235, 125, 40), "pink": (235, 130, 170),
                 "purple": (120, 60, 160), "grey": (128, 128, 128)}
BIKE_COLOURS = {"red": (190, 35, 35), "blue": (40, 80, 190), "black": (25, 25, 25), "green": (40, 140, 60),
                "yellow": (230, 200, 40), "white": (235, 235, 235), "orange": (230, 120, 30)}
PANTS = [(40, 50, 90), (30, 30, 30), (90, 80, 70), (60, 60, 64), (150, 130, 100)]
SKIN = [(230, 190, 160), (200, 150, 110), (150, 100, 70), (100, 70, 50)]

NO_DIFFERENCE = ("there is no difference", "there are no differences", "nothing has changed", "no change",
                 "the two images are the same", "there is no change", "i see no difference",
                 "both images are identical", "nothing is different", "no differences")
NO_DIFFERENCE_EXTRA = ("the images look the same", "only the lighting is slightly different",
                       "everything is in the same place", "no one moved")


# -- sites ------------------------------------------------------------------------------------------------
@lru_cache(maxsize=N_SITES * 2)
def site(seed: int, k: int) -> dict:
    """Layout of camera site ``k`` (bands, bays, lanes, static objects, sun direction): a pure function."""
    rng = np.random.default_rng([seed, 1_000_003, k])
    H = SIZE * SCALE
    horizon = int(H * rng.uniform(0.17, 0.28))
    walk = int(H * rng.uniform(0.07, 0.10))
    road = int(H * rng.uniform(0.20, 0.26))
    lot_first = bool(k % 2)  # half the sites look at the lot across the road, half at the road across the lot
    kerb = int(H * 0.035)
    heights = {"walk": walk, "road": road, "kerb": kerb, "lot": H - horizon - walk - road - kerb}
    bands, y = {}, horizon
    for name in (["walk", "lot", "kerb", "road"] if lot_first else ["walk", "road", "kerb", "lot"]):
        bands[name] = (y, y + heights[name])
        y += heights[name]
    bays_per_row = int(rng.integers(6, 9))
    lot0, lot1 = bands["lot"]
    rows = 1 if lot1 - lot0 < H * 0.3 else 2
    bay_rows = [lot0 + (lot1 - lot0) * (r + 0.5) / rows for r in range(rows)]
    shade = rng.uniform(0.85, 1.1)
    buildings, x = [], 0
    while x < H:
        w = int(H * rng.uniform(0.18, 0.4))
        buildings.append({"x0": x, "x1": min(H, x + w), "top": int(horizon * rng.uniform(0.0, 0.45)),
                          "colour": tuple(int(c) for c in rng.choice(
                              [(150, 80, 60), (200, 185, 160), (130, 130, 135), (220, 215, 205), (120, 95, 80),
                               (170, 160, 140)])),
                          "rows": int(rng.integers(2, 4)), "cols": int(rng.integers(3, 7))})
        x += w
    trees = [(int(rng.uniform(0.05, 0.95) * H), int(np.mean(bands["walk"])) + int(rng.integers(-4, 5)))
             for _ in range(int(rng.integers(0, 3)))]
    return {"k": k, "horizon": horizon, "bands": bands, "bay_rows": bay_rows, "bays": bays_per_row,
            "buildings": buildings, "trees": trees, "sun": (float(rng.uniform(-1, 1)), float(rng.uniform(0.3, 0.8))),
            "asphalt": tuple(int(c * shade) for c in (88, 88, 92)),
            "lot": tuple(int(c * shade) for c in (104, 102, 100)),
            "walk": tuple(int(c * shade) for c in (176, 172, 164)), "dash": (235, 235, 225) if rng.random() < 0.6
            else (230, 190, 60), "sky": (196, 208, 222)}


def scale_at(s: dict, y: float) -> float:
    """Perspective: things near the bottom of the frame are closer and drawn larger."""
    H = SIZE * SCALE
    return 0.6 + 0.55 * (y - s["horizon"]) / (H - s["horizon"])


@lru_cache(maxsize=N_SITES * 2)
def _background(seed: int, k: int) -> bytes:
    s = site(seed, k)
    H = SIZE * SCALE
    img = Image.new("RGB", (H, H), s["sky"])
    d = ImageDraw.Draw(img, "RGBA")
    for b in s["buildings"]:
        d.rectangle([b["x0"], b["top"], b["x1"], s["horizon"]], fill=b["colour"])
        d.rectangle([b["x0"], b["top"], b["x1"], b["top"] + 6], fill=tuple(int(c * 0.7) for c in b["colour"]))
        w, h = b["x1"] - b["x0"], s["horizon"] - b["top"] - 10
        for r in range(b["rows"]):
            for c in range(b["cols"]):
                x0 = b["x0"] + w * (c + 0.25) / b["cols"]
                y0 = b["top"] + 12 + h * (r + 0.2) / b["rows"]
                d.rectangle([x0, y0, x0 + w * 0.5 / b["cols"], y0 + h * 0.45 / b["rows"]], fill=(60, 70, 85))
        d.line([b["x0"], b["top"], b["x0"], s["horizon"]], fill=(70, 70, 70), width=2)
    w0, w1 = s["bands"]["walk"]
    d.rectangle([0, w0, H, w1], fill=s["walk"])
    d.rectangle([0, w0, H, w0 + (w1 - w0) * 0.35], fill=(0, 0, 0, 60))          # the buildings' shadow
    for x in range(0, H, 22):
        d.line([x, w0, x - 6, w1], fill=(150, 146, 140), width=1)                # paving joints
    r0, r1 = s["bands"]["road"]
    d.rectangle([0, r0, H, r1], fill=s["asphalt"])
    mid = (r0 + r1) / 2
    for x in range(-10, H, 44):
        d.rectangle([x, mid - 2, x + 24, mid + 2], fill=s["dash"])
    d.rectangle([0, r0 + 3, H, r0 + 5], fill=(220, 220, 210))
    d.rectangle([0, r1 - 5, H, r1 - 3], fill=(220, 220, 210))
    k0, k1 = s["bands"]["kerb"]
    d.rectangle([0, k0, H, k1], fill=tuple(min(255, c + 25) for c in s["walk"]))
    d.rectangle([0, k0, H, k0 + 3], fill=(120, 118, 112))
    d.rectangle([0, k1 - 3, H, k1], fill=(120, 118, 112))
    l0, l1 = s["bands"]["lot"]
    d.rectangle([0, l0, H, l1], fill=s["lot"])
    bw = H / s["bays"]
    for yc in s["bay_rows"]:
        half = 34 * scale_at(s, yc)
        for i in range(s["bays"] + 1):
            d.line([i * bw, yc - half, i * bw, yc + half], fill=(225, 225, 215), width=2)
    rng = np.random.default_rng([seed, 1_000_004, k])
    for _ in range(40):                                                           # oil stains, patches
        x, y = rng.uniform(0, H), rng.uniform(min(r0, l0), H)
        rr = rng.uniform(3, 12)
        d.ellipse([x - rr, y - rr * 0.5, x + rr, y + rr * 0.5], fill=(0, 0, 0, int(rng.integers(10, 35))))
    for tx, ty in s["trees"]:
        sc = scale_at(s, ty)
        dx = s["sun"][0] * 20 * sc
        d.ellipse([tx - 26 * sc + dx, ty - 8 * sc, tx + 26 * sc + dx, ty + 10 * sc], fill=(0, 0, 0, 70))
        d.rectangle([tx - 3 * sc, ty - 30 * sc, tx + 3 * sc, ty], fill=(90, 60, 40))
        d.ellipse([tx - 22 * sc, ty - 62 * sc, tx + 22 * sc, ty - 22 * sc], fill=(50, 110, 50))
        d.ellipse([tx - 12 * sc, ty - 58 * sc, tx + 8 * sc, ty - 40 * sc], fill=(70, 135, 65))
    return np.asarray(img).tobytes()


# -- objects ----------------------------------------------------------------------------------------------
def _colour(table: dict, rng) -> str:
    return str(rng.choice(sorted(table)))


def _place(s: dict, kind: str, rng, taken: list) -> dict | None:
    """A free spot for a new object of ``kind``, or None after a few tries."""
    H = SIZE * SCALE
    for _ in range(30):
        if kind == "car" and rng.random() < 0.6:
            row = int(rng.integers(len(s["bay_rows"])))
            bay = int(rng.integers(s["bays"]))
            x, y, place, vertical = (bay + 0.5) * H / s["bays"], s["bay_rows"][row], "lot", True
        elif kind == "car":
            r0, r1 = s["bands"]["road"]
            lane = int(rng.integers(2))
            x, y, place, vertical = rng.uniform(0.08, 0.92) * H, r0 + (r1 - r0) * (0.3 + 0.42 * lane), "road", False
        else:
            band = "walk" if rng.random() < 0.6 else "lot"
            y0, y1 = s["bands"][band]
            x, y, place, vertical = rng.uniform(0.05, 0.95) * H, rng.uniform(y0 + 0.3 * (y1 - y0), y1 - 4), band, False
        sc = scale_at(s, y)
        hx, hy = {"car": (19, 33) if vertical else (38, 17), "person": (8, 21), "bike": (19, 9)}[kind]
        hx, hy, cy = hx * sc, hy * sc, y - (20 * sc if kind == "person" else 7 * sc if kind == "bike" else 0)
        if all(abs(x - o["x"]) > hx + o["hx"] or abs(cy - o["cy"]) > hy + o["hy"] for o in taken if o):
            obj = {"kind": kind, "x": float(x), "y": float(y), "place": place, "vertical": vertical,
                   "hx": float(hx), "hy": float(hy), "cy": float(cy)}
            if kind == "car":
                obj["colour"] = _colour(CAR_COLOURS, rng)
            elif kind == "person":
                obj["colour"] = _colour(SHIRT_COLOURS, rng)
                obj["pants"] = int(rng.integers(len(PANTS)))
                obj["skin"] = int(rng.integers(len(SKIN)))
            else:
                obj["colour"] = _colour(BIKE_COLOURS, rng)
            return obj
    return None


def _kind(rng) -> str:
    return str(rng.choice(["car", "person", "bike"], p=[0.55, 0.33, 0.12]))


def _box(x0: float, y0: float, x1: float, y1: float) -> list[float]:
    """A shadow's bounding box with its corners in order: a low sun stretches it past its own object (PIL refuses
    x1 < x0); boxes already in order are returned unchanged, so every earlier image stays byte-identical."""
    return [min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)]


def _draw_object(d, s: dict, o: dict) -> None:
    sc = scale_at(s, o["y"])
    x, y = o["x"], o["y"]
    sx, sy = s["sun"][0] * 14 * sc, s["sun"][1] * 8 * sc
    if o["kind"] == "car":
        L, W = (34 * sc, 62 * sc) if o["vertical"] else (72 * sc, 30 * sc)
        body = CAR_COLOURS[o["colour"]]
        d.rounded_rectangle([x - L / 2 + sx, y - W / 2 + sy, x + L / 2 + sx, y + W / 2 + sy], radius=8 * sc,
                            fill=(0, 0, 0, 90))
        for wx in (-1, 1):
            for wy in (-1, 1):
                cx, cy = x + wx * L * 0.33, y + wy * W * 0.42
                if o["vertical"]:
                    cx, cy = x + wx * L * 0.44, y + wy * W * 0.32
                d.rectangle([cx - 5 * sc, cy - 4 * sc, cx + 5 * sc, cy + 4 * sc], fill=(20, 20, 20))
        d.rounded_rectangle([x - L / 2, y - W / 2, x + L / 2, y + W / 2], radius=7 * sc, fill=body,
                            outline=tuple(int(c * 0.6) for c in body), width=max(1, int(sc * 2)))
        roof = tuple(min(255, int(c * 0.85 + 20)) for c in body)
        if o["vertical"]:
            d.rounded_rectangle([x - L * 0.36, y - W * 0.22, x + L * 0.36, y + W * 0.25], radius=5 * sc, fill=roof)
            d.rectangle([x - L * 0.34, y - W * 0.34, x + L * 0.34, y - W * 0.22], fill=(45, 55, 70))
            d.rectangle([x - L * 0.32, y + W * 0.25, x + L * 0.32, y + W * 0.33], fill=(45, 55, 70))
        else:
            d.rounded_rectangle([x - L * 0.22, y - W * 0.36, x + L * 0.25, y + W * 0.36], radius=5 * sc, fill=roof)
            d.rectangle([x - L * 0.33, y - W * 0.34, x - L * 0.22, y + W * 0.34], fill=(45, 55, 70))
            d.rectangle([x + L * 0.25, y - W * 0.32, x + L * 0.32, y + W * 0.32], fill=(45, 55, 70))
    elif o["kind"] == "person":
        h, w = 40 * sc, 12 * sc
        d.ellipse(_box(x - w * 0.8 + sx, y - 3 * sc + sy * 0.3, x + w * 0.8 + sx * 2.5, y + 3 * sc + sy * 0.3),
                  fill=(0, 0, 0, 90))
        d.rectangle([x - w * 0.4, y - h * 0.45, x + w * 0.4, y], fill=PANTS[o["pants"]])
        d.line([x, y - h * 0.4, x, y], fill=(0, 0, 0, 80), width=1)
        d.rounded_rectangle([x - w / 2, y - h * 0.82, x + w / 2, y - h * 0.42], radius=3 * sc,
                            fill=SHIRT_COLOURS[o["colour"]])
        d.ellipse([x - w * 0.32, y - h, x + w * 0.32, y - h * 0.8], fill=SKIN[o["skin"]])
        d.chord([x - w * 0.32, y - h, x + w * 0.32, y - h * 0.8], 180, 360, fill=(40, 30, 25))
    else:
        r, gap = 7 * sc, 11 * sc
        colour = BIKE_COLOURS[o["colour"]]
        d.ellipse(_box(x - gap - r + sx, y - 2 * sc + sy * 0.3, x + gap + r + sx * 2, y + 3 * sc + sy * 0.3),
                  fill=(0, 0, 0, 70))
        for cx in (x - gap, x + gap):
            d.ellipse([cx - r, y - 2 * r, cx + r, y], outline=(25, 25, 25), width=max(1, int(2 * sc)))
        top = y - 2 * r
        w = max(1, int(2.5 * sc))
        d.line([x - gap, y - r, x, y - r, x + gap * 0.7, top, x - gap * 0.4, top, x - gap, y - r], fill=colour,
               width=w)
        d.line([x, y - r, x - gap * 0.4, top - 3 * sc], fill=colour, width=w)
        d.line([x + gap * 0.7, top, x + gap * 0.8, top - 4 * sc], fill=(30, 30, 30), width=w)


def render(seed: int, k: int, objects: list[dict], light: dict, rng) -> np.ndarray:
    """One 224x224 frame: site ``k``, ``objects`` back to front, then light (gain, tint) and sensor noise."""
    H = SIZE * SCALE
    img = Image.frombytes("RGB", (H, H), _background(seed, k))
    d = ImageDraw.Draw(img, "RGBA")
    for o in sorted(objects, key=lambda o: (o["y"], o["x"])):
        _draw_object(d, site(seed, k), o)
    small = np.asarray(img.resize((SIZE, SIZE), Image.BOX), dtype=np.float32) / 255.0
    small = np.clip(small * light["gain"] * np.asarray(light["tint"], dtype=np.float32), 0, 1) ** light["gamma"]
    small = small * 255.0 + rng.normal(0.0, light["noise"], small.shape)
    return np.clip(np.rint(small), 0, 255).astype(np.uint8)


def _light(rng, base: dict | None, strong: bool, light_change: float = 1.0) -> dict:
    """The frame's light: a fresh one (``base`` None), or ``base`` changed by up to 12 % (``strong``, the pairs
    without an object change) or 4 %, times ``light_change``. The same draws whatever ``light_change`` is, so the
    objects, sentences and noise of a pair do not depend on it."""
    if base is None:
        return {"gain": float(rng.uniform(0.8, 1.15)), "gamma": float(rng.uniform(0.9, 1.1)),
                "tint": [float(v) for v in 1 + rng.uniform(-0.04, 0.04, 3)], "noise": float(rng.uniform(1.5, 3.5))}
    spread = (0.12 if strong else 0.04) * light_change
    return {"gain": base["gain"] * float(rng.uniform(1 - spread, 1 + spread)),
            "gamma": base["gamma"] * float(rng.uniform(1 - spread / 2, 1 + spread / 2)),
            "tint": [t * float(v) for t, v in zip(base["tint"], 1 + rng.uniform(-spread / 3, spread / 3, 3))],
            "noise": float(rng.uniform(1.5, 3.5))}


# -- language -----------------------------------------------------------------------------------------------
def noun(o: dict, rng) -> str:
    c = o["colour"]
    if o["kind"] == "car":
        return str(rng.choice([f"{c} car", f"{c} car", f"{c} vehicle", "car" if rng.random() < 0.3 else f"{c} car"]))
    if o["kind"] == "person":
        return str(rng.choice([f"person in {c}", f"man in a {c} shirt", f"person wearing {c}", f"{c} shirt guy",
                               f"person with a {c} shirt"]))
    return str(rng.choice([f"{c} bike", f"{c} bicycle", f"{c} bike"]))


def where(o: dict, rng=None) -> str:
    """A location phrase for the object; the first one when ``rng`` is None (single-image descriptions)."""
    H = SIZE * SCALE
    side = "left" if o["x"] < H / 3 else "right" if o["x"] > 2 * H / 3 else ""
    vert = "top" if o["y"] < H * 0.5 else "bottom"
    place = {"lot": "in the parking lot", "road": "on the road", "walk": "on the sidewalk"}[o["place"]]
    options = [place, f"{place} on the {side}" if side else f"{place} in the middle",
               f"in the {vert} {side}" if side else f"at the {vert}"]
    if o["place"] == "walk":
        options.append("near the building")
    return options[0] if rng is None else str(rng.choice(options))


def describe(objects: list[dict]) -> str:
    """``there is A , B and C``, objects left to right (the format the stand-in CLIP's pre-training splits)."""
    if not objects:
        return "there is an empty street"
    parts = []
    for o in sorted(objects, key=lambda o: (o["x"], o["y"])):
        c = o["colour"]
        thing = {"car": f"a {c} car", "person": f"a person in {c}", "bike": f"a {c} bike"}[o["kind"]]
        parts.append(f"{thing} {where(o)}")
    return "there is " + (parts[0] if len(parts) == 1 else " , ".join(parts[:-1]) + " and " + parts[-1])


def _direction(a: dict, b: dict) -> str:
    dx, dy = b["x"] - a["x"], b["y"] - a["y"]
    if abs(dx) >= abs(dy):
        return "to the right" if dx > 0 else "to the left"
    return "closer to the camera" if dy > 0 else "further away"


def sentence(change: dict, rng) -> str:
    kind, o = change["change"], change["object"]
    n, w = noun(o, rng), where(o, rng)
    if kind == "appeared":
        options = [f"a {n} has appeared {w}", f"there is a {n} {w} in the right image",
                   f"a new {n} is {w}", f"the {n} {w} is new", f"a {n} was added {w}",
                   f"there is a {n} {w} that was not there before"]
    elif kind == "gone":
        options = [f"the {n} {w} is gone", f"the {n} is no longer there", f"the {n} {w} has left",
                   f"there is no {n} {w} anymore", f"the {n} {w} is missing in the right image",
                   f"the {n} {w} in the left image is not in the right image"]
    else:
        new = change["to"]
        options = [f"the {n} has moved", f"the {n} moved {_direction(o, new)}", f"the {n} {w} is now {where(new, rng)}",
                   f"the {n} changed position", f"the {n} {w} moved a little {_direction(o, new)}"]
    return str(rng.choice(options))


def annotate(changes: list[dict], rng) -> list[list[str]]:
    """1-3 annotators' sentences (1-4 each) for a pair with ``changes`` (empty = no change)."""
    out = []
    for _ in range(int(rng.choice(ANNOTATORS, p=ANNOTATOR_P))):
        if not changes or rng.random() < MISS_P:
            sents = [str(rng.choice(NO_DIFFERENCE))]
            if rng.random() < 0.15:
                sents.append(str(rng.choice(NO_DIFFERENCE_EXTRA)))
        else:
            told = [c for c in changes if rng.random() < 0.85] or [changes[int(rng.integers(len(changes)))]]
            sents = [sentence(c, rng) for c in told]
            if len(sents) < 4 and rng.random() < 0.25:
                extra = sentence(told[int(rng.integers(len(told)))], rng)
                if extra not in sents:
                    sents.append(extra)
        out.append(sents[:4])
    return out


# -- one pair ------------------------------------------------------------------------------------------------
def plan_pair(seed: int, index: int) -> tuple[dict, np.random.Generator]:
    """Everything about pair ``index`` but its pixels: site, objects before and after, changes, sentences.

    Returns the generator too: :func:`make_pair` draws the light and the noise from the same stream afterwards,
    so a plan is the same whether or not the pair is rendered.
    """
    rng = np.random.default_rng([seed, index])
    k = int(rng.integers(N_SITES))
    s = site(seed, k)
    before: list[dict] = []
    for _ in range(int(rng.integers(3, 10))):
        o = _place(s, _kind(rng), rng, before)
        if o is not None:
            before.append(o)
    after = [dict(o) for o in before]
    changes: list[dict] = []
    if rng.random() >= NO_CHANGE_SHARE:
        n_changes = int(rng.choice([1, 2, 3], p=[0.55, 0.3, 0.15]))
        touched: set[int] = set()
        for _ in range(n_changes):
            kind = str(rng.choice(["appeared", "gone", "moved"]))
            free = [i for i in range(len(before)) if i not in touched]
            if kind != "appeared" and len(free) < 2:
                kind = "appeared"
            if kind == "appeared":
                o = _place(s, _kind(rng), rng, after)
                if o is None:
                    continue
                after.append(o)
                changes.append({"change": "appeared", "object": o})
                continue
            i = free[int(rng.integers(len(free)))]
            touched.add(i)
            if kind == "gone":
                after[i] = None
                changes.append({"change": "gone", "object": before[i]})
            else:
                others = [o for j, o in enumerate(after) if j != i and o is not None]
                for _ in range(10):
                    moved = _place(s, before[i]["kind"], rng, others)
                    if moved is not None and abs(moved["x"] - before[i]["x"]) + abs(moved["y"] - before[i]["y"]) > 60:
                        break
                    moved = None
                if moved is None:
                    after[i] = None
                    changes.append({"change": "gone", "object": before[i]})
                    continue
                moved.update({key: before[i][key] for key in ("colour", "pants", "skin") if key in before[i]})
                after[i] = moved
                changes.append({"change": "moved", "object": before[i], "to": moved})
        after = [o for o in after if o is not None]
    return {"index": index, "site": k, "before": before, "after": after, "changes": changes,
            "annotators": annotate(changes, rng), "descriptions": (describe(before), describe(after))}, rng


def make_pair(job: tuple[int, int, float]) -> dict:
    seed, index, light_change = job
    plan, rng = plan_pair(seed, index)
    light = _light(rng, None, False)
    before = render(seed, plan["site"], plan["before"], light, rng)   # draws its noise before the after-light
    after = render(seed, plan["site"], plan["after"], _light(rng, light, not plan["changes"], light_change), rng)
    images = (before, after)
    return {**plan, "images": images}


# -- the dataset ----------------------------------------------------------------------------------------------
def generate(out: str | Path, *, n_pairs: int | None = None, seed: int | None = None, workers: int | None = None,
             light_change: float | None = None, profile: str | None = None, overwrite: bool = False,
             progress: bool = True, force: bool = False) -> Path:
    """Write SynthSpot-the-Diff to ``out`` (atomically); reuse it if it already holds the same arguments.
    ``force``: write beside entries the generator did not write (kept, never deleted). An argument left None is
    ``configs/synth_spot_the_diff.json``'s at ``profile`` (None: the default profile).

    ``light_change`` scales how much the light differs between a pair's two frames (1.0: up to 12 % in gain
    where no object changed, 4 % where one did; 0: the same light, only the sensor noise differs); the objects,
    sentences and noise draws are the same at every value. Recorded in ``synth_info.json``."""
    a = writing.from_profile("synth_spot_the_diff", profile, pairs=n_pairs, seed=seed, workers=workers,
                             light_change=light_change)
    n_pairs, seed, workers, light_change = a["pairs"], a["seed"], a["workers"], a["light_change"]
    out = writing.check_common(Path(out), n_pairs, 12, workers, seed)
    if not (isinstance(light_change, (int, float)) and 0 <= light_change <= 2):
        raise ConfigError(f"light_change must be a number in [0, 2], got {light_change!r}",
                          fix="pass 1.0 for the default light, 0 for none between the two frames")
    info = {"synthetic": True, "generator": GENERATOR_VERSION, "pairs": n_pairs, "seed": seed, "size": [SIZE, SIZE],
            "light_change": float(light_change)}
    claim = writing.claim(out, "synth-spot-the-diff", info, overwrite, force,
                          legacy={"light_change": 1.0})   # sets from before the knob: 1.0
    if claim is None:
        return out
    splits = writing.split_ids(n_pairs, seed, SPLIT_FRACTIONS)
    split_of = {i: s for s, ids in splits.items() for i in ids}
    entries: dict[str, list[dict]] = {s: [] for s in splits}
    descriptions, changes = {}, {}
    with writing.staging(claim) as tmp:
        (tmp / "annotations").mkdir()
        (tmp / "resized_images").mkdir()
        jobs = [(seed, i, float(light_change)) for i in range(n_pairs)]
        for r in tqdm(writing.ordered_map(make_pair, jobs, workers), total=n_pairs, desc="SynthSpot-the-Diff",
                      unit="pair", disable=not progress):
            i = r["index"]
            for name, img in zip((f"{i}.png", f"{i}_2.png"), r["images"]):
                (tmp / "resized_images" / name).write_bytes(writing.encode(Image.fromarray(img), "png"))
            descriptions[f"{i}.png"], descriptions[f"{i}_2.png"] = r["descriptions"]
            changes[str(i)] = [{"change": c["change"], "object": c["object"], **({"to": c["to"]} if "to" in c else {})}
                               for c in r["changes"]]
            entries[split_of[i]].extend({"img_id": str(i), "sentences": sents} for sents in r["annotators"])
        counts = {}
        for s, rows in entries.items():
            stream = np.random.default_rng([seed, 2**31 - 3, ("train", "val", "test").index(s)])
            order = stream.permutation(len(rows))      # entries of one pair are not adjacent: readers must group
            rows = [rows[j] for j in order]
            writing.write_json(tmp / "annotations" / f"{s}.json", rows)
            sents = [x for e in rows for x in e["sentences"]]
            counts[s] = {"pairs": len(splits[s]), "entries": len(rows), "sentences": len(sents),
                         "no_difference_sentences": sum(x in NO_DIFFERENCE or x in NO_DIFFERENCE_EXTRA
                                                        for x in sents)}
        writing.write_json(tmp / "scene_descriptions.json", descriptions)
        writing.write_json(tmp / "changes.json", changes)
        writing.write_json(tmp / writing.MARKER, {**info, "counts": counts}, indent=1)
    return out
