"""CLEVR scenes and CLEVR-Change (default, semantic, nonsemantic) triplets, sampled in CLEVR's scene format.

Follows facebookresearch/clevr-dataset-gen (``render_images.py``: ``add_random_objects``,
``compute_all_relationships``, the camera/lamp jitter) and Seth-Park's CLEVR-Change fork of it
(``render.sh``, ``render_images.py``):

  - 3-10 objects; size first, then a position uniform in [-3, 3]^2 accepted if, against every placed object,
    ``dist - r - rr >= min_dist`` (0.25) and, along each of left/right/front/behind, the offset is not in
    ``(0, margin)`` (0.4); after ``max_retries`` (50) failures for one object the whole scene is re-sampled;
    then shape, colour, rotation uniform in [0, 360) and material; a cube's radius is divided by sqrt(2) and
    the object rests on the ground (z = radius);
  - every object must cover at least 200 pixels at 480x320, scaled here by (W*H)/(480*320), counted on the
    renderer's object-id buffer; a triplet in which any object of any of its three images falls short is
    re-sampled from scratch;
  - camera: CLEVR's base location (7.3589, -6.9258, 4.9583) aimed at the origin, a 35 mm lens on a 32 mm
    sensor (49.13 deg across the wider side); lamps key/fill/back at CLEVR's base positions;
    ``rand(L) = 2L(u - 0.5)`` per axis. The default image moves the camera by rand(L_camera) and each lamp by
    rand(L_lamp); the semantic and the nonsemantic image each re-apply those jitters and add fresh independent
    ones of the same sizes. CLEVR-Change renders with L_camera = L_lamp = 1.0 (the defaults here); both are
    parameters so that easier sets can be generated. As in Blender, the jitter moves the camera without turning
    it, so ``look_at`` moves with it;
  - ``directions`` and ``relationships`` exactly as CLEVR (eps 0.2), from each scene's own camera;
  - change operators: ``color`` (a different colour), ``material`` (rubber <-> metal), ``add`` (a random new
    object placed under the same distance/margin checks, appended last), ``drop`` (remove one).

Deviations / choices:
  - ``move`` exists in the real data but not in the public generator (its branch is empty). Here the object
    keeps its shape, size, colour, material and rotation, gets a new position under the same checks against
    the other objects, at least ``MOVE_MIN_DISTANCE`` (1.0) from where it was so the move is visible.
  - CLEVR's base camera has a 0.6 deg roll; this camera has none. Lamp positions are CLEVR's base_scene values
    rounded to 4 decimals.
  - CoGenT shape/colour constraints are not enforced (the generator's ``render.sh`` names CoGenT_A.json, yet the
    released captions mention red cubes and yellow cylinders).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np

from idckit.data.clevr_change import CHANGE_TYPES, default_name, nonsemantic_name, semantic_name
from idckit.data.synth.render import fill_pixel_coords, object_ids
from idckit.data.synth.vocab import COLORS, MATERIALS, RELATION_EPS, SHAPES, SIZES

BASE_CAMERA = (7.3589, -6.9258, 4.9583)
BASE_LAMPS = {"key": (6.4467, 2.9052, 4.2584), "fill": (-4.6711, -4.0136, 3.0112),
              "back": (-1.1685, 2.6460, 5.8157)}
FOV_DEG = math.degrees(2 * math.atan(16.0 / 35.0))  # Blender: 35 mm lens, 32 mm sensor
# CLEVR-Change's render.sh passes --camera_jitter 1.0 (CLEVR's argparse default is 0.5); lamps move by rand(1.0).
CAMERA_JITTER = 1.0
LAMP_JITTER = 1.0

MIN_OBJECTS, MAX_OBJECTS = 3, 10
MIN_DIST = 0.25
MARGIN = 0.4
MIN_PIXELS_PER_OBJECT = 200  # at CLEVR's 480x320
MAX_RETRIES = 50
MOVE_MIN_DISTANCE = 1.0
MAX_TRIPLET_ATTEMPTS = 1000  # a safety net; typical triplets need 1-3 attempts

_COLOR_NAMES = tuple(COLORS)
_SIZE_NAMES = tuple(SIZES)
_SPLIT_NAMES = {"default": default_name, "semantic": semantic_name, "nonsemantic": nonsemantic_name}


def rand_jitter(rng: np.random.Generator, L: float) -> list[float]:
    """CLEVR's ``rand(L) = 2 * L * (random.random() - 0.5)``, once per axis."""
    return [float(2.0 * L * (u - 0.5)) for u in rng.random(3)]


def _add(a, b) -> list[float]:
    return [float(x) + float(y) for x, y in zip(a, b)]


@dataclass(frozen=True)
class View:
    """Accumulated camera and lamp jitters of one image (offsets from CLEVR's base scene)."""

    camera: list[float]
    lamps: dict[str, list[float]]

    @classmethod
    def sample(cls, rng: np.random.Generator, base: "View | None" = None, *, camera_jitter: float = CAMERA_JITTER,
               lamp_jitter: float = LAMP_JITTER) -> "View":
        # The draws do not depend on the jitter sizes, so datasets that differ only in jitter share their scenes
        # wherever the visibility checks agree.
        cam = rand_jitter(rng, camera_jitter)
        lamps = {name: rand_jitter(rng, lamp_jitter) for name in BASE_LAMPS}
        if base is None:
            return cls(cam, lamps)
        return cls(_add(base.camera, cam), {k: _add(base.lamps[k], v) for k, v in lamps.items()})

    def camera_dict(self) -> dict:
        return {"location": _add(BASE_CAMERA, self.camera), "look_at": list(self.camera), "fov_deg": FOV_DEG}

    def lamps_dict(self) -> dict:
        return {name: _add(pos, self.lamps[name]) for name, pos in BASE_LAMPS.items()}


def compute_directions(camera: dict) -> dict[str, list[float]]:
    """CLEVR's cardinal directions: the camera's forward (behind) and -x (left) axes projected on the ground."""
    fx, fy = (float(a) - float(b) for a, b in zip(camera["look_at"][:2], camera["location"][:2]))
    norm = math.hypot(fx, fy)
    behind = [fx / norm, fy / norm, 0.0]
    left = [-fy / norm, fx / norm, 0.0]  # camera right = forward x z_up = (fy, -fx, 0)
    return {"behind": behind, "front": [-behind[0], -behind[1], 0.0], "left": left,
            "right": [-left[0], -left[1], 0.0], "above": [0.0, 0.0, 1.0], "below": [0.0, 0.0, -1.0]}


def compute_relationships(objects: list[dict], directions: dict, eps: float = RELATION_EPS) -> dict:
    """``rel[name][i]`` = sorted j != i with ``dot(coords_j - coords_i, directions[name]) > eps`` (CLEVR)."""
    out = {}
    for name, vec in directions.items():
        if name in ("above", "below"):
            continue
        rows = []
        for i, a in enumerate(objects):
            ca = a["3d_coords"]
            rows.append([j for j, b in enumerate(objects) if j != i and
                         sum((b["3d_coords"][k] - ca[k]) * vec[k] for k in range(3)) > eps])
        out[name] = rows
    return out


def make_scene(split: str, index: int, objects: list[dict], view: View) -> dict:
    camera = view.camera_dict()
    directions = compute_directions(camera)
    objects = copy.deepcopy(objects)
    return {"split": split, "image_index": int(index), "image_filename": _SPLIT_NAMES[split](index),
            "objects": objects, "directions": directions,
            "relationships": compute_relationships(objects, directions),
            "camera": camera, "lamps": view.lamps_dict()}


# ---------------------------------------------------------------------------------------------------------
# Object placement (CLEVR's add_random_objects)
# ---------------------------------------------------------------------------------------------------------
def position_ok(x: float, y: float, r: float, placed: list[tuple[float, float, float]], directions: dict) -> bool:
    """CLEVR's checks of a candidate position against placed (x, y, r): min_dist and the directional margin."""
    for xx, yy, rr in placed:
        dx, dy = x - xx, y - yy
        if math.sqrt(dx * dx + dy * dy) - r - rr < MIN_DIST:
            return False
        for name in ("left", "right", "front", "behind"):
            v = directions[name]
            margin = dx * v[0] + dy * v[1]
            if 0 < margin < MARGIN:
                return False
    return True


def _place(rng, r, placed, directions, avoid: tuple[float, float] | None = None):
    for _ in range(MAX_RETRIES):
        x, y = (float(v) for v in rng.uniform(-3.0, 3.0, size=2))
        if avoid is not None and math.hypot(x - avoid[0], y - avoid[1]) < MOVE_MIN_DISTANCE:
            continue
        if position_ok(x, y, r, placed, directions):
            return x, y
    return None


def _placed(objects: list[dict]) -> list[tuple[float, float, float]]:
    return [(o["3d_coords"][0], o["3d_coords"][1], o["3d_coords"][2]) for o in objects]


def random_object(rng: np.random.Generator, placed, directions) -> dict | None:
    """One new object in CLEVR's draw order (size, position, shape, colour, rotation, material); None if no
    position passes the checks within MAX_RETRIES."""
    size = _SIZE_NAMES[int(rng.integers(len(_SIZE_NAMES)))]
    r = SIZES[size]
    pos = _place(rng, r, placed, directions)
    if pos is None:
        return None
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    color = _COLOR_NAMES[int(rng.integers(len(_COLOR_NAMES)))]
    if shape == "cube":
        r /= math.sqrt(2)
    theta = float(360.0 * rng.random())
    material = MATERIALS[int(rng.integers(len(MATERIALS)))]
    return {"shape": shape, "color": color, "material": material, "size": size,
            "3d_coords": [pos[0], pos[1], r], "rotation": theta, "pixel_coords": [0, 0, 0.0]}


def sample_objects(rng: np.random.Generator, directions: dict,
                   n_objects: tuple[int, int] = (MIN_OBJECTS, MAX_OBJECTS)) -> list[dict]:
    n = int(rng.integers(n_objects[0], n_objects[1] + 1))
    while True:  # CLEVR restarts the whole scene (same object count) when one object cannot be placed
        objects: list[dict] = []
        for _ in range(n):
            obj = random_object(rng, _placed(objects), directions)
            if obj is None:
                break
            objects.append(obj)
        if len(objects) == n:
            return objects


# ---------------------------------------------------------------------------------------------------------
# Visibility
# ---------------------------------------------------------------------------------------------------------
def min_visible_pixels(size: tuple[int, int]) -> float:
    """CLEVR's 200 pixels per object at 480x320, scaled by image area."""
    w, h = size
    return MIN_PIXELS_PER_OBJECT * (w * h) / (480 * 320)


def visible_pixels(scene: dict, size: tuple[int, int]) -> np.ndarray:
    """Pixels per object in the renderer's object-id buffer."""
    ids = object_ids(scene, size)
    return np.bincount(ids[ids >= 0], minlength=len(scene["objects"]))


def all_visible(scene: dict, size: tuple[int, int]) -> bool:
    return bool((visible_pixels(scene, size) >= min_visible_pixels(size)).all())


# ---------------------------------------------------------------------------------------------------------
# Change operators
# ---------------------------------------------------------------------------------------------------------
def apply_change(rng: np.random.Generator, objects: list[dict], change_type: str, directions: dict):
    """(after objects, change record) for one change of ``change_type``, or None if ``add``/``move`` could not
    place the object. The after list keeps the before order (drop removes one, add appends one)."""
    after = copy.deepcopy(objects)
    n = len(objects)
    if change_type == "add":
        obj = random_object(rng, _placed(objects), directions)
        if obj is None:
            return None
        after.append(obj)
        return after, {"type": "add", "before_index": None, "after_index": n, "attribute": None}
    i = int(rng.integers(n))
    if change_type == "color":
        others = [c for c in _COLOR_NAMES if c != objects[i]["color"]]
        after[i]["color"] = others[int(rng.integers(len(others)))]
        return after, {"type": "color", "before_index": i, "after_index": i, "attribute": after[i]["color"]}
    if change_type == "material":
        after[i]["material"] = "metal" if objects[i]["material"] == "rubber" else "rubber"
        return after, {"type": "material", "before_index": i, "after_index": i, "attribute": after[i]["material"]}
    if change_type == "drop":
        del after[i]
        return after, {"type": "drop", "before_index": i, "after_index": None, "attribute": None}
    if change_type == "move":
        old = objects[i]["3d_coords"]
        pos = _place(rng, SIZES[objects[i]["size"]], _placed(objects[:i] + objects[i + 1:]), directions,
                     avoid=(old[0], old[1]))
        if pos is None:
            return None
        after[i]["3d_coords"] = [pos[0], pos[1], old[2]]
        return after, {"type": "move", "before_index": i, "after_index": i, "attribute": None}
    raise ValueError(f"unknown change type {change_type!r}; expected one of {', '.join(CHANGE_TYPES)}")


def sample_triplet(rng: np.random.Generator, index: int, change_type: str, size: tuple[int, int], *,
                   camera_jitter: float = CAMERA_JITTER, lamp_jitter: float = LAMP_JITTER,
                   n_objects: tuple[int, int] = (MIN_OBJECTS, MAX_OBJECTS)) -> tuple[dict, dict, dict]:
    """(default, semantic, nonsemantic) scenes for image ``index``; every object of every image is visible.

    The semantic scene carries the change record under ``"change"``. ``pixel_coords`` are filled for each
    scene's own camera at ``size``. ``camera_jitter`` and ``lamp_jitter`` are CLEVR's ``L`` of ``rand(L)``, used
    for the before image's offset and again for each after image's fresh offset, as CLEVR-Change uses 1.0 for both.
    ``n_objects`` = (fewest, most) objects of the before scene, CLEVR's 3-10 by default.
    """
    jitter = {"camera_jitter": camera_jitter, "lamp_jitter": lamp_jitter}
    for _ in range(MAX_TRIPLET_ATTEMPTS):
        view = View.sample(rng, **jitter)
        directions = compute_directions(view.camera_dict())
        objects = sample_objects(rng, directions, n_objects)
        default = make_scene("default", index, objects, view)
        if not all_visible(default, size):
            continue
        changed = apply_change(rng, objects, change_type, directions)
        if changed is None:
            continue
        after_objects, change = changed
        semantic = make_scene("semantic", index, after_objects, View.sample(rng, base=view, **jitter))
        semantic["change"] = change
        if not all_visible(semantic, size):
            continue
        nonsemantic = make_scene("nonsemantic", index, objects, View.sample(rng, base=view, **jitter))
        if not all_visible(nonsemantic, size):
            continue
        for scene in (default, semantic, nonsemantic):
            fill_pixel_coords(scene, size)
        return default, semantic, nonsemantic
    raise RuntimeError(f"could not sample a visible CLEVR-Change triplet in {MAX_TRIPLET_ATTEMPTS} attempts "
                       f"at size {size} (is the image too small?)")
