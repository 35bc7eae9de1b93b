"""A small vectorised numpy ray caster for CLEVR scenes (SynthCLEVR-Change).

It draws a scene dict in the shared scene format (``idckit/data/synth/scene.py``; CLEVR's scene JSON plus
``camera`` and ``lamps``) the way CLEVR's Blender scene looks, closely enough that anyone who knows CLEVR
recognises it: a grey ground plane, spheres, cubes rotated about z and upright cylinders resting on it, lit by
CLEVR's three lamps (key, fill, back) plus a dim ambient term, then gamma-encoded.

What follows CLEVR (facebookresearch/clevr-dataset-gen, ``base_scene.blend`` / ``render_images.py``):
  - geometry: an object of size radius ``r`` sits at z = r; a cube's half-edge is r (its radius was already
    divided by sqrt(2) when the scene was sampled), a cylinder has radius r and height 2r;
  - camera: a pinhole with Blender's sensor fit AUTO (``fov_deg`` spans the wider image side);
  - ``pixel_coords``: Blender's ``world_to_camera_view`` as CLEVR's ``get_camera_coords`` uses it,
    ``[round(x * W), round(H - y * H), depth]``.

Deviations (a ray caster, not Cycles with 512 samples and 8 bounces):
  - shading is Lambert + Blinn-Phong; lamps fall off with 1/d^2 normalised at the scene origin;
  - only the key lamp casts shadows; they are soft (an area lamp sampled at ``SHADOW_SAMPLES`` fixed points,
    so no noise) and the other light is darkened by an analytic ambient-occlusion term (contact shadows);
  - metal is a tinted mirror: one reflection bounce (objects, ground, a bright sky) plus a highlight, no blur;
  - anti-aliasing only where the object-id buffer has an edge (5 samples there, 1 elsewhere).
The output is deterministic: no random numbers, no reductions whose order could change, no BLAS calls.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from idckit.data.synth.vocab import COLORS

EPS = 1e-4
SPHERE, CUBE, CYLINDER = 0, 1, 2
_KIND = {"sphere": SPHERE, "cube": CUBE, "cylinder": CYLINDER}

# Look parameters (linear light). Tuned by eye against CLEVR's own renders.
GROUND_ALBEDO = 0.42
AMBIENT = 0.30
LAMP_POWER = {"key": 1.05, "fill": 0.35, "back": 0.35}
KEY_LAMP_RADIUS = 1.1  # soft shadows: CLEVR's key lamp is an area lamp
SHADOW_SAMPLES = 16
SKY = 0.85  # what a metal object reflects above the horizon
EXPOSURE = 1.0


def _srgb_to_linear(c: np.ndarray) -> np.ndarray:
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _linear_to_srgb(c: np.ndarray) -> np.ndarray:
    return np.where(c <= 0.0031308, 12.92 * c, 1.055 * np.power(np.maximum(c, 0.0031308), 1 / 2.4) - 0.055)


# The vocabulary's sRGB swatches, as linear albedo, so a fully lit face shows the swatch colour.
ALBEDO = {name: _srgb_to_linear(np.asarray(rgb, dtype=np.float64) / 255.0) for name, rgb in COLORS.items()}


@dataclass(frozen=True)
class _Obj:
    kind: int
    c: np.ndarray  # centre (3,)
    r: float  # sphere/cylinder radius, cube half-edge
    cos: float
    sin: float
    bound: float  # bounding-sphere radius, for culling
    albedo: np.ndarray  # linear RGB (3,)
    metal: bool


def _objects(scene: dict) -> list[_Obj]:
    out = []
    for o in scene["objects"]:
        kind = _KIND[o["shape"]]
        x, y, z = (float(v) for v in o["3d_coords"])
        r = z  # objects rest on the ground, so the centre height is the (cube-adjusted) radius
        th = math.radians(float(o.get("rotation", 0.0)))
        bound = r * (math.sqrt(3.0) if kind == CUBE else math.sqrt(2.0) if kind == CYLINDER else 1.0)
        out.append(_Obj(kind, np.array([x, y, z]), r, math.cos(th), math.sin(th), bound * 1.001,
                        ALBEDO[o["color"]], o["material"] == "metal"))
    return out


# ---------------------------------------------------------------------------------------------------------
# Camera
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Camera:
    loc: np.ndarray
    fwd: np.ndarray
    right: np.ndarray
    up: np.ndarray
    tan_x: float  # tan of half the horizontal field of view
    tan_y: float
    width: int
    height: int

    @classmethod
    def from_scene(cls, scene: dict, size: tuple[int, int]) -> "Camera":
        cam = scene["camera"]
        loc = np.asarray(cam["location"], dtype=np.float64)
        fwd = np.asarray(cam["look_at"], dtype=np.float64) - loc
        fwd = fwd / math.sqrt(float(fwd[0] ** 2 + fwd[1] ** 2 + fwd[2] ** 2))
        right = np.array([fwd[1], -fwd[0], 0.0])  # fwd x z_up: the camera has no roll
        right = right / math.sqrt(float(right[0] ** 2 + right[1] ** 2))
        up = np.array([right[1] * fwd[2] - right[2] * fwd[1], right[2] * fwd[0] - right[0] * fwd[2],
                       right[0] * fwd[1] - right[1] * fwd[0]])
        w, h = size
        t = math.tan(math.radians(float(cam["fov_deg"])) / 2)
        tan_x, tan_y = (t, t * h / w) if w >= h else (t * w / h, t)  # Blender sensor fit AUTO
        return cls(loc, fwd, right, up, tan_x, tan_y, w, h)

    def rays(self, px: np.ndarray, py: np.ndarray) -> np.ndarray:
        """Unit directions (3, n) through continuous pixel positions (x right, y down, pixel centres at +0.5)."""
        sx = (px / self.width * 2 - 1) * self.tan_x
        sy = (1 - py / self.height * 2) * self.tan_y
        d = np.stack([self.fwd[k] + sx * self.right[k] + sy * self.up[k] for k in range(3)])
        return d / np.sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2])

    def project(self, p) -> list:
        """CLEVR's ``get_camera_coords``: ``[px, py, depth]`` with px, py rounded to integer pixels."""
        v = np.asarray(p, dtype=np.float64) - self.loc
        z = float(v[0] * self.fwd[0] + v[1] * self.fwd[1] + v[2] * self.fwd[2])
        x = float(v[0] * self.right[0] + v[1] * self.right[1] + v[2] * self.right[2]) / (z * self.tan_x)
        y = float(v[0] * self.up[0] + v[1] * self.up[1] + v[2] * self.up[2]) / (z * self.tan_y)
        x01, y01 = (x + 1) / 2, (y + 1) / 2
        return [int(round(x01 * self.width)), int(round(self.height - y01 * self.height)), z]


# ---------------------------------------------------------------------------------------------------------
# Ray-object intersection. Rays are (3, n) origin/direction arrays with unit directions; a miss is inf.
# ---------------------------------------------------------------------------------------------------------
def _hit_sphere(o: _Obj, O: np.ndarray, D: np.ndarray) -> np.ndarray:
    ox, oy, oz = O[0] - o.c[0], O[1] - o.c[1], O[2] - o.c[2]
    b = ox * D[0] + oy * D[1] + oz * D[2]
    disc = b * b - (ox * ox + oy * oy + oz * oz - o.r * o.r)
    t = -b - np.sqrt(np.maximum(disc, 0.0))
    return np.where((disc > 0) & (t > EPS), t, np.inf)


def _to_local(o: _Obj, x: np.ndarray, y: np.ndarray):
    return o.cos * x + o.sin * y, -o.sin * x + o.cos * y


def _hit_cube(o: _Obj, O: np.ndarray, D: np.ndarray) -> np.ndarray:
    lx, ly = _to_local(o, O[0] - o.c[0], O[1] - o.c[1])
    dx, dy = _to_local(o, D[0], D[1])
    tnear = np.full(O.shape[1], -np.inf)
    tfar = np.full(O.shape[1], np.inf)
    for p, d in ((lx, dx), (ly, dy), (O[2] - o.c[2], D[2])):
        d = np.where(np.abs(d) < 1e-12, 1e-12, d)  # parallel rays: huge slab times, same answer
        t1 = (-o.r - p) / d
        t2 = (o.r - p) / d
        tnear = np.maximum(tnear, np.minimum(t1, t2))
        tfar = np.minimum(tfar, np.maximum(t1, t2))
    return np.where((tnear <= tfar) & (tnear > EPS), tnear, np.inf)


def _hit_cylinder(o: _Obj, O: np.ndarray, D: np.ndarray) -> np.ndarray:
    px, py = O[0] - o.c[0], O[1] - o.c[1]
    a = np.maximum(D[0] * D[0] + D[1] * D[1], 1e-12)
    b = px * D[0] + py * D[1]
    disc = b * b - a * (px * px + py * py - o.r * o.r)
    ts = (-b - np.sqrt(np.maximum(disc, 0.0))) / a
    zs = O[2] + ts * D[2]
    t_side = np.where((disc > 0) & (ts > EPS) & (zs >= 0) & (zs <= 2 * o.r), ts, np.inf)
    # Top cap only: the bottom cap lies on the ground and no ray reaches it before the side or top.
    dz = np.where(np.abs(D[2]) < 1e-12, 1e-12, D[2])
    tt = (2 * o.r - O[2]) / dz
    qx, qy = px + tt * D[0], py + tt * D[1]
    t_top = np.where((tt > EPS) & (qx * qx + qy * qy <= o.r * o.r), tt, np.inf)
    return np.minimum(t_side, t_top)


_HIT = {SPHERE: _hit_sphere, CUBE: _hit_cube, CYLINDER: _hit_cylinder}


def _normal(o: _Obj, P: np.ndarray) -> np.ndarray:
    px, py, pz = P[0] - o.c[0], P[1] - o.c[1], P[2] - o.c[2]
    if o.kind == SPHERE:
        return np.stack([px, py, pz]) / o.r
    if o.kind == CYLINDER:
        rho = np.sqrt(px * px + py * py)
        top = pz / o.r > rho / o.r  # whichever surface the point lies closer to
        inv = 1.0 / np.maximum(rho, 1e-12)
        return np.stack([np.where(top, 0.0, px * inv), np.where(top, 0.0, py * inv), np.where(top, 1.0, 0.0)])
    lx, ly = _to_local(o, px, py)
    ax, ay, az = np.abs(lx), np.abs(ly), np.abs(pz)
    on_x = (ax >= ay) & (ax >= az)
    on_y = ~on_x & (ay >= az)
    on_z = ~on_x & ~on_y
    nx_l = np.where(on_x, np.sign(lx), 0.0)
    ny_l = np.where(on_y, np.sign(ly), 0.0)
    # rotate the local normal back to world
    return np.stack([o.cos * nx_l - o.sin * ny_l, o.sin * nx_l + o.cos * ny_l, np.where(on_z, np.sign(pz), 0.0)])


def _cull(o: _Obj, O: np.ndarray, D: np.ndarray, tmax: np.ndarray, pad: float = 0.0) -> np.ndarray:
    """Rays whose segment [0, tmax] passes within the object's bounding sphere (+pad)."""
    vx, vy, vz = o.c[0] - O[0], o.c[1] - O[1], o.c[2] - O[2]
    tca = vx * D[0] + vy * D[1] + vz * D[2]
    rr = o.bound + pad
    d2 = vx * vx + vy * vy + vz * vz - tca * tca
    return (d2 <= rr * rr) & (tca + rr > EPS) & (tca - rr < tmax)


def _closest(objs: list[_Obj], O: np.ndarray, D: np.ndarray, skip: np.ndarray | None = None):
    """Nearest object hit per ray: (t, object index or -1)."""
    n = D.shape[1]
    best_t = np.full(n, np.inf)
    best_id = np.full(n, -1, dtype=np.int32)
    for k, o in enumerate(objs):
        cand = _cull(o, O, D, best_t)
        if skip is not None:
            cand &= skip != k
        idx = np.flatnonzero(cand)
        if idx.size == 0:
            continue
        t = _HIT[o.kind](o, O[:, idx], D[:, idx])
        better = t < best_t[idx]
        best_t[idx[better]] = t[better]
        best_id[idx[better]] = k
    return best_t, best_id


# ---------------------------------------------------------------------------------------------------------
# Lighting
# ---------------------------------------------------------------------------------------------------------
def _disc_pattern(k: int) -> np.ndarray:
    """k fixed points on the unit disc (Fibonacci spiral): the same for every pixel, so shadows are noise-free."""
    i = np.arange(k) + 0.5
    rad = np.sqrt(i / k)
    ang = i * math.pi * (3 - math.sqrt(5))
    return np.stack([rad * np.cos(ang), rad * np.sin(ang)])


_DISC = _disc_pattern(SHADOW_SAMPLES)


def _lamp_samples(lamp: np.ndarray) -> np.ndarray:
    """Points (3, k) on a disc of radius KEY_LAMP_RADIUS facing the scene origin."""
    n = lamp / np.linalg.norm(lamp)
    a = np.cross(n, [0.0, 0.0, 1.0])
    a = a / np.linalg.norm(a)
    b = np.cross(n, a)
    return lamp[:, None] + KEY_LAMP_RADIUS * (a[:, None] * _DISC[0] + b[:, None] * _DISC[1])


def _shadow(objs: list[_Obj], P: np.ndarray, hit_id: np.ndarray, lamp: np.ndarray) -> np.ndarray:
    """Fraction (n,) of the key lamp's area visible from each point; the point's own object is skipped
    (its terminator comes from the Lambert term)."""
    n = P.shape[1]
    samples = _lamp_samples(lamp)
    k = samples.shape[1]
    blocked = np.zeros((n, k), dtype=bool)
    L = lamp[:, None] - P
    dist = np.sqrt(L[0] * L[0] + L[1] * L[1] + L[2] * L[2])
    Dc = L / dist
    for j, o in enumerate(objs):
        # every sample ray stays within the lamp radius of the central one, so pad the culling by it
        idx = np.flatnonzero(_cull(o, P, Dc, dist, pad=KEY_LAMP_RADIUS) & (hit_id != j))
        if idx.size == 0:
            continue
        Po = np.repeat(P[:, idx], k, axis=1)
        V = np.tile(samples, (1, idx.size)) - Po
        d = np.sqrt(V[0] * V[0] + V[1] * V[1] + V[2] * V[2])
        t = _HIT[o.kind](o, Po, V / d)
        blocked[idx] |= (t < d).reshape(idx.size, k)
    return 1.0 - np.count_nonzero(blocked, axis=1) / k


def _ambient_occlusion(objs: list[_Obj], P: np.ndarray, N: np.ndarray, hit_id: np.ndarray) -> np.ndarray:
    """Analytic occlusion of a sphere of each object's size over each point's hemisphere (contact shadows)."""
    vis = np.ones(P.shape[1])
    for j, o in enumerate(objs):
        rad = o.r * (1.15 if o.kind != SPHERE else 1.0)
        vx, vy, vz = o.c[0] - P[0], o.c[1] - P[1], o.c[2] - P[2]
        d2 = np.maximum(vx * vx + vy * vy + vz * vz, rad * rad)
        cos = np.maximum((vx * N[0] + vy * N[1] + vz * N[2]) / np.sqrt(d2), 0.0)
        occ = np.where(hit_id == j, 0.0, cos * rad * rad / d2)
        vis = vis * (1.0 - 0.8 * occ)
    return vis


def _lamps(scene: dict) -> dict[str, np.ndarray]:
    return {name: np.asarray(scene["lamps"][name], dtype=np.float64) for name in ("key", "fill", "back")}


def _shade(objs: list[_Obj], lamps: dict[str, np.ndarray], O: np.ndarray, D: np.ndarray):
    """Colour (3, n) in linear light and the object id (n,) seen along each ray (-1: ground)."""
    n = D.shape[1]
    t_obj, hit_id = _closest(objs, O, D)
    t_ground = np.where(D[2] < -1e-9, -O[2] / np.where(D[2] < -1e-9, D[2], -1.0), np.inf)
    on_ground = t_ground <= t_obj
    hit_id = np.where(on_ground, -1, hit_id)
    t = np.where(on_ground, t_ground, t_obj)
    sky = ~np.isfinite(t)
    t = np.where(sky, 0.0, t)
    P = O + t * D

    N = np.zeros((3, n))
    N[2] = 1.0
    albedo = np.full((3, n), GROUND_ALBEDO)
    metal = np.zeros(n, dtype=bool)
    for j, o in enumerate(objs):
        idx = np.flatnonzero(hit_id == j)
        if idx.size:
            N[:, idx] = _normal(o, P[:, idx])
            albedo[:, idx] = o.albedo[:, None]
            metal[idx] = o.metal
    P = P + 1e-4 * N  # lift off the surface so secondary rays do not re-hit it

    V = -D
    ao = _ambient_occlusion(objs, P, N, hit_id)
    diffuse = AMBIENT * ao
    spec = np.zeros(n)
    for name, lamp in lamps.items():
        L = lamp[:, None] - P
        d2 = L[0] * L[0] + L[1] * L[1] + L[2] * L[2]
        Ld = L / np.sqrt(d2)
        power = LAMP_POWER[name] * float(lamp @ lamp) / d2  # 1/d^2, normalised at the origin
        ndl = np.maximum(N[0] * Ld[0] + N[1] * Ld[1] + N[2] * Ld[2], 0.0)
        vis = _shadow(objs, P, hit_id, lamp) if name == "key" else ao
        diffuse = diffuse + power * ndl * vis
        H = Ld + V
        H = H / np.sqrt(np.maximum(H[0] * H[0] + H[1] * H[1] + H[2] * H[2], 1e-12))
        ndh = np.maximum(N[0] * H[0] + N[1] * H[1] + N[2] * H[2], 0.0)
        shininess = np.where(metal, 90.0, 12.0)
        ks = np.where(metal, 1.4, np.where(hit_id >= 0, 0.06, 0.0))
        spec = spec + ks * power * vis * np.where(ndl > 0, ndh ** shininess, 0.0)
    color = albedo * diffuse + spec

    midx = np.flatnonzero(metal)
    if midx.size:
        color[:, midx] = albedo[:, midx] * (0.15 * diffuse[midx] + 0.85 * _reflect(objs, lamps, P[:, midx],
                                                                                   D[:, midx], N[:, midx],
                                                                                   hit_id[midx])) + spec[midx]
    color[:, sky] = SKY
    return color, hit_id


def _reflect(objs, lamps, P, D, N, hit_id):
    """One mirror bounce, shaded cheaply (key lamp Lambert + ambient, no shadows)."""
    dn = D[0] * N[0] + D[1] * N[1] + D[2] * N[2]
    R = D - 2 * dn * N
    t_obj, rid = _closest(objs, P, R, skip=hit_id)
    t_ground = np.where(R[2] < -1e-9, -P[2] / np.where(R[2] < -1e-9, R[2], -1.0), np.inf)
    on_ground = (t_ground <= t_obj) & np.isfinite(t_ground)
    Q = P + np.where(np.isfinite(np.minimum(t_obj, t_ground)), np.minimum(t_obj, t_ground), 0.0) * R
    key = lamps["key"][:, None]
    L = key - Q
    L = L / np.sqrt(L[0] * L[0] + L[1] * L[1] + L[2] * L[2])
    n = P.shape[1]
    Nq = np.zeros((3, n))
    Nq[2] = 1.0
    alb = np.full((3, n), GROUND_ALBEDO)
    for j, o in enumerate(objs):
        idx = np.flatnonzero((rid == j) & ~on_ground)
        if idx.size:
            Nq[:, idx] = _normal(o, Q[:, idx])
            alb[:, idx] = o.albedo[:, None]
    ndl = np.maximum(Nq[0] * L[0] + Nq[1] * L[1] + Nq[2] * L[2], 0.0)
    # A horizon fade: the far ground is seen at grazing angles and looks brighter in a glossy surface.
    out = alb * (AMBIENT + LAMP_POWER["key"] * ndl)
    sky = ~on_ground & (rid < 0)
    grad = SKY * (0.75 + 0.25 * np.clip(R[2], 0, 1))
    out[:, sky] = grad[sky]
    return out


# ---------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------
def _pixel_grid(w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    py, px = np.mgrid[0:h, 0:w].astype(np.float64)
    return px.ravel() + 0.5, py.ravel() + 0.5


def object_ids(scene: dict, size: tuple[int, int]) -> np.ndarray:
    """Object-id buffer (H, W) int32 (-1: background) from one ray per pixel centre: what the renderer sees."""
    w, h = size
    cam = Camera.from_scene(scene, size)
    objs = _objects(scene)
    px, py = _pixel_grid(w, h)
    D = cam.rays(px, py)
    O = np.broadcast_to(cam.loc[:, None], D.shape)
    t_obj, hit_id = _closest(objs, O, D)
    t_ground = np.where(D[2] < -1e-9, -O[2] / np.where(D[2] < -1e-9, D[2], -1.0), np.inf)
    return np.where(t_ground <= t_obj, -1, hit_id).astype(np.int32).reshape(h, w)


def fill_pixel_coords(scene: dict, size: tuple[int, int]) -> None:
    """Set every object's ``pixel_coords`` for this scene's camera (CLEVR's ``get_camera_coords``)."""
    cam = Camera.from_scene(scene, size)
    for o in scene["objects"]:
        o["pixel_coords"] = cam.project(o["3d_coords"])


# Rotated-grid 4x supersampling offsets for edge pixels (plus the centre sample).
_AA_OFFSETS = ((-0.125, -0.375), (0.375, -0.125), (0.125, 0.375), (-0.375, 0.125))


def render(scene: dict, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Render ``scene`` at ``size=(W, H)``: (uint8 image (H, W, 3), int32 object ids (H, W), -1 = background).

    The id buffer is the one-ray-per-pixel-centre buffer of :func:`object_ids`. Also fills each object's
    ``pixel_coords`` in ``scene`` (mutates it).
    """
    w, h = size
    cam = Camera.from_scene(scene, size)
    objs = _objects(scene)
    lamps = _lamps(scene)
    fill_pixel_coords(scene, size)

    px, py = _pixel_grid(w, h)
    D = cam.rays(px, py)
    O = np.broadcast_to(cam.loc[:, None], D.shape)
    color, ids = _shade(objs, lamps, O, D)
    ids = ids.reshape(h, w)

    # Anti-alias silhouettes: pixels whose id differs from a 4-neighbour get 4 more samples.
    edge = np.zeros((h, w), dtype=bool)
    edge[:, 1:] |= ids[:, 1:] != ids[:, :-1]
    edge[:, :-1] |= ids[:, 1:] != ids[:, :-1]
    edge[1:, :] |= ids[1:, :] != ids[:-1, :]
    edge[:-1, :] |= ids[1:, :] != ids[:-1, :]
    eidx = np.flatnonzero(edge.ravel())
    if eidx.size:
        m = eidx.size
        Ds = cam.rays(np.concatenate([px[eidx] + dx for dx, _ in _AA_OFFSETS]),
                      np.concatenate([py[eidx] + dy for _, dy in _AA_OFFSETS]))
        c, _ = _shade(objs, lamps, np.broadcast_to(cam.loc[:, None], Ds.shape), Ds)
        acc = color[:, eidx]
        for k in range(len(_AA_OFFSETS)):  # a fixed summation order keeps the bytes reproducible
            acc = acc + c[:, k * m:(k + 1) * m]
        color[:, eidx] = acc / (1 + len(_AA_OFFSETS))

    srgb = _linear_to_srgb(np.clip(color * EXPOSURE, 0.0, 1.0))
    img = (srgb * 255.0 + 0.5).astype(np.uint8).T.reshape(h, w, 3)
    return img, ids.astype(np.int32)
