"""SynthBirds' taxonomy: orders > families > genera > species, each species a set of named, visible attributes.

Attributes are inherited down the tree (an order fixes body size and build, a family the beak and tail, a genus
the wings, eye ring and legs, a species its head and breast colours), and a child redraws an inherited attribute
with a small probability, so two species of one genus differ in a few attributes and two orders in most: the
fine-grained structure that Birds-to-Words' pivot-branch sampling (sameGenus ... sameClass) is about.

Individuals of a species differ in what a photo varies: facing direction, tilt, scale in the frame, position,
background (sky, foliage, water), light and sensor noise. The text may talk about ``facing`` and ``background``;
the rest is nuisance.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: sRGB swatches of every colour word the text uses.
PALETTE: dict[str, tuple[int, int, int]] = {
    "black": (34, 32, 30), "white": (238, 236, 230), "gray": (128, 130, 136), "brown": (118, 74, 40),
    "buff": (214, 184, 136), "red": (196, 38, 34), "orange": (232, 128, 30), "yellow": (238, 206, 44),
    "olive": (116, 128, 48), "blue": (48, 88, 196), "pink": (228, 160, 158),
}
PLUMAGE = ("black", "white", "gray", "brown", "buff", "red", "orange", "yellow", "olive", "blue")

#: Ordered attributes (the text compares them: "larger", "a longer beak"), smallest first.
ORDINAL: dict[str, tuple[str, ...]] = {
    "size": ("small", "medium", "large"),
    "body": ("slender", "plump"),
    "tail_length": ("short", "long"),
    "beak_length": ("short", "medium", "long"),
    "beak_width": ("thin", "thick"),
    "leg_length": ("short", "long"),
}
#: Unordered attributes and their values. Value words never repeat across attributes that share a body part,
#: so "a hooked beak" and "a yellow beak" parse to different attributes.
CATEGORICAL: dict[str, tuple] = {
    "tail_shape": ("rounded", "pointed", "forked"),
    "beak_shape": ("straight", "hooked", "curved"),
    "beak_color": ("black", "gray", "yellow", "orange", "pink"),
    "crown_color": PLUMAGE,
    "nape_color": PLUMAGE,
    "breast_color": PLUMAGE,
    "belly_color": ("white", "gray", "buff", "yellow", "brown", "orange"),
    "wing_color": ("black", "gray", "brown", "olive", "blue", "red", "buff"),
    "breast_pattern": ("plain", "spotted", "streaked"),
    "wing_pattern": ("plain", "spotted", "striped"),
    "wing_bars": (False, True),
    "eye_ring": ("none", "white", "yellow"),
    "leg_color": ("black", "gray", "pink", "yellow", "orange"),
}
SPECIES_ATTRS: tuple[str, ...] = (*ORDINAL, *CATEGORICAL)
#: Which level of the tree decides an attribute first (a species redraws 2-4 of its own, else keeps the genus's).
LEVEL_ATTRS: dict[str, tuple[str, ...]] = {
    "order": ("size", "body", "tail_length", "leg_length"),
    "family": ("beak_length", "beak_width", "beak_shape", "tail_shape"),
    "genus": ("wing_color", "wing_pattern", "eye_ring", "leg_color", "belly_color"),
    "species": ("crown_color", "nape_color", "breast_color", "breast_pattern", "wing_bars", "beak_color"),
}
#: Chance that a child redraws an attribute its parent already fixed.
REDRAW = {"family": 0.12, "genus": 0.1, "species": 0.04}
#: What the photo varies that the text may mention.
FACING = ("left", "right")
BACKGROUNDS = ("sky", "foliage", "water")

# Genus common nouns (one per genus; cycled with a numeral if the tree is bigger than the list).
_NOUNS = ("warbler", "finch", "sparrow", "thrush", "tanager", "wren", "vireo", "flycatcher", "bunting", "grosbeak",
          "kingbird", "oriole", "swallow", "chickadee", "nuthatch", "creeper", "kinglet", "pipit", "lark", "shrike",
          "jay", "starling", "cowbird", "towhee", "junco", "waxwing", "phoebe", "pewee", "thrasher", "catbird",
          "mockingbird", "dipper", "martin", "siskin", "crossbill", "redstart", "yellowthroat", "ovenbird",
          "gnatcatcher", "bushtit", "titmouse", "longspur", "meadowlark", "grackle", "bobolink", "becard")
_SYLL = ("ca", "lo", "mi", "ra", "te", "phi", "lu", "so", "ver", "na", "to", "ri", "zo", "pe", "du", "xan", "thi",
         "cor", "pas", "ser", "ae", "gi", "mo", "cha", "ly")


@dataclass(frozen=True)
class Species:
    species_id: int  # 0..S-1
    name: str  # Latin-looking binomial, as iNaturalist names species ("Passer domesticus")
    common: str  # "Red-crowned Warbler": the CUB / NABirds class name
    order: int
    family: int
    genus: int
    attrs: dict = field(hash=False, compare=False)


@dataclass
class Taxonomy:
    orders: list[str]
    families: list[tuple[str, int]]  # (name, order index)
    genera: list[tuple[str, int]]  # (name, family index)
    species: list[Species]

    def same(self, a: Species, b: Species) -> str:
        """The closest rank the two share, as Birds-to-Words' selection names it."""
        if a.species_id == b.species_id:
            return "sameSpecies"
        for rank, sel in (("genus", "sameGenus"), ("family", "sameFamily"), ("order", "sameOrder")):
            if getattr(a, rank) == getattr(b, rank):
                return sel
        return "sameClass"


def _word(rng: np.random.Generator, n: int) -> str:
    return "".join(_SYLL[int(k)] for k in rng.integers(len(_SYLL), size=n))


def _draw(rng: np.random.Generator, attr: str):
    values = ORDINAL.get(attr) or CATEGORICAL[attr]
    return values[int(rng.integers(len(values)))]


def _inherit(rng, parent: dict, level: str) -> dict:
    out = {a: (_draw(rng, a) if rng.random() < REDRAW[level] else v) for a, v in parent.items()}
    own = LEVEL_ATTRS[level]
    if level == "species":  # a species departs from its genus's look in a few features only
        own = [own[int(k)] for k in rng.choice(len(own), size=int(rng.integers(2, 5)), replace=False)]
    out.update({a: _draw(rng, a) for a in own})
    return out


def _common_name(attrs: dict, noun: str, taken: set[str]) -> str:
    cands = [f"{attrs['crown_color']}-crowned", f"{attrs['breast_color']}-breasted",
             f"{attrs['nape_color']}-naped", f"{attrs['wing_color']}-winged", f"{attrs['beak_color']}-billed",
             f"{attrs['breast_color']}-and-{attrs['crown_color']}"]
    for adj in cands:
        name = f"{adj.capitalize()} {noun.capitalize()}"
        if name not in taken:
            return name
    k = 2
    while f"{cands[0].capitalize()} {noun.capitalize()} {k}" in taken:
        k += 1
    return f"{cands[0].capitalize()} {noun.capitalize()} {k}"


def sample_taxonomy(seed: int, *, orders: int = 5, families: int = 4, genera: int = 2, species: int = 5) -> Taxonomy:
    """``orders x families x genera x species`` species (200 by default, like CUB), all with distinct attributes
    and every two species of a genus differing in at least two attributes."""
    rng = np.random.default_rng([seed, 7001])
    tax = Taxonomy([], [], [], [])
    seen: set[tuple] = set()
    names: set[str] = set()
    for o in range(orders):
        o_attrs = {a: _draw(rng, a) for a in SPECIES_ATTRS}
        tax.orders.append(_word(rng, 2).capitalize() + "iformes")
        for _ in range(families):
            f_attrs = _inherit(rng, o_attrs, "family")
            tax.families.append((_word(rng, 2).capitalize() + "idae", o))
            for _ in range(genera):
                g_attrs = _inherit(rng, f_attrs, "genus")
                g = len(tax.genera)
                genus_name = _word(rng, 3).capitalize()
                tax.genera.append((genus_name, len(tax.families) - 1))
                members: list[dict] = []
                noun = _NOUNS[g % len(_NOUNS)] + ("" if g < len(_NOUNS) else f"-{g // len(_NOUNS) + 1}")
                while len(members) < species:
                    s_attrs = _inherit(rng, g_attrs, "species")
                    key = tuple(s_attrs[a] for a in SPECIES_ATTRS)
                    if key in seen or any(sum(s_attrs[a] != m[a] for a in SPECIES_ATTRS) < 2 for m in members):
                        continue
                    seen.add(key)
                    members.append(s_attrs)
                    epithet = _word(rng, 2) + ("us", "a", "is", "ii")[int(rng.integers(4))]
                    common = _common_name(s_attrs, noun, names)
                    names.add(common)
                    tax.species.append(Species(len(tax.species), f"{genus_name} {epithet}", common, o,
                                               len(tax.families) - 1, g, s_attrs))
    return tax


def attribute_distance(a: dict, b: dict) -> int:
    return sum(a[k] != b[k] for k in SPECIES_ATTRS)


def visual_neighbour(tax: Taxonomy, sp: Species, rng: np.random.Generator) -> Species:
    """A different species that looks most alike (fewest differing attributes; ties broken by ``rng``): the
    ``visual`` branch, which in the real data came from visual similarity rather than the tree."""
    d = np.array([attribute_distance(sp.attrs, o.attrs) if o.species_id != sp.species_id else 10**6
                  for o in tax.species])
    best = np.flatnonzero(d == d.min())
    return tax.species[int(best[int(rng.integers(len(best)))])]


def sample_individual(rng: np.random.Generator) -> dict:
    """What one photo of a bird varies. ``facing`` and ``background`` are named in the text; the rest is nuisance."""
    return {
        "facing": FACING[int(rng.integers(2))],
        "background": BACKGROUNDS[int(rng.integers(3))],
        "tilt": float(rng.uniform(-18, 18)),
        "scale": float(rng.uniform(0.82, 1.1)),
        "dx": float(rng.uniform(-0.08, 0.08)),
        "dy": float(rng.uniform(-0.06, 0.06)),
        "light": float(rng.uniform(0.72, 1.18)),
        "tint": [float(v) for v in rng.uniform(-0.06, 0.06, size=3)],
        "noise": float(rng.uniform(0.0, 0.045)),
        "bg_seed": int(rng.integers(2**31)),
    }
