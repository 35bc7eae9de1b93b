"""CLEVR's object vocabulary (clevr-dataset-gen ``properties.json``) and the CLEVR-Change caption synonyms.

Shared by the scene sampler, the renderer and the caption grammar, so one table says what a "small cyan
metal cylinder" is.
"""
from __future__ import annotations

SHAPES: tuple[str, ...] = ("cube", "sphere", "cylinder")
# sRGB values from CLEVR's properties.json.
COLORS: dict[str, tuple[int, int, int]] = {
    "gray": (87, 87, 87),
    "red": (173, 35, 35),
    "blue": (42, 75, 215),
    "green": (29, 105, 20),
    "brown": (129, 74, 25),
    "purple": (129, 38, 192),
    "cyan": (41, 208, 208),
    "yellow": (255, 238, 51),
}
MATERIALS: tuple[str, ...] = ("rubber", "metal")
# Blender-unit radii; a cube's radius is divided by sqrt(2) so it does not look larger than a sphere.
SIZES: dict[str, float] = {"large": 0.7, "small": 0.35}

# Caption synonyms (the CLEVR-Change generator's synonyms.json, Seth-Park/clevr-dataset-gen).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "cube": ("cube", "block"),
    "sphere": ("sphere", "ball"),
    "cylinder": ("cylinder",),
    "thing": ("thing", "object"),
    "large": ("large", "big"),
    "small": ("small", "tiny"),
    "metal": ("metallic", "metal", "shiny"),
    "rubber": ("rubber", "matte"),
    "left": ("left of", "to the left of", "on the left side of"),
    "right": ("right of", "to the right of", "on the right side of"),
    "behind": ("behind",),
    "front": ("in front of",),
}

# Only these four relations appear in CLEVR-Change captions; CLEVR's eps for "left of" etc.
RELATIONS: tuple[str, ...] = ("left", "right", "behind", "front")
RELATION_EPS = 0.2


NO_CHANGE_SENTENCES: tuple[str, ...] = (
    "no change was made",
    "there is no change",
    "the two scenes seem identical",
    "the scene is the same as before",
    "the scene remains the same",
    "nothing has changed",
    "nothing was modified",
    "no change has occurred",
    "there is no difference",
)

# Version of the generator's output; bump when a change alters the bytes written for the same arguments.
GENERATOR_VERSION = "synthclevr-change-1"
