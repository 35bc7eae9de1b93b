"""SynthCLEVR-Change generation speed: images/s with 1 and 2 workers at a profile's image size and jitter.

Target: >= 12 images/s with 2 workers on a 2-core machine. Each pair index writes 3 images.
Prints ratios; asserts nothing (machines are noisy).
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from idckit.data.synth.clevr_change import generate
from idckit.experiments.config import PROFILES, load_config
from idckit.paths import DEFAULT_PROFILE

TARGET = 12.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=120)
    ap.add_argument("--profile", default=DEFAULT_PROFILE, choices=PROFILES, help="whose synthetic data is measured")
    ap.add_argument("--size", default=None, help="WxH (default: the profile's)")
    args = ap.parse_args()
    cfg = load_config("synth_clevr_change", args.profile)
    size = tuple(int(v) for v in args.size.split("x")) if args.size else tuple(cfg["size"])
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2):
            out = Path(tmp) / f"w{workers}"
            t0 = time.perf_counter()
            generate(out, n_pairs=args.pairs, seed=0, size=size, camera_jitter=cfg["camera_jitter"],
                     lamp_jitter=cfg["lamp_jitter"], workers=workers, progress=False)
            rates[workers] = 3 * args.pairs / (time.perf_counter() - t0)
            shutil.rmtree(out)
    print(f"SynthCLEVR-Change of the {args.profile} profile at {size[0]}x{size[1]} (camera/lamp jitter "
          f"{cfg['camera_jitter']:g}/{cfg['lamp_jitter']:g}), {args.pairs} pairs ({3 * args.pairs} images):")
    for w, r in rates.items():
        print(f"  workers={w}: {r:6.1f} images/s")
    print(f"  2-worker speedup over 1: {rates[2] / rates[1]:.2f}x")
    print(f"  2 workers vs the {TARGET:.0f} images/s target: {rates[2] / TARGET:.2f}x")


if __name__ == "__main__":
    main()
