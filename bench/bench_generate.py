"""SynthCLEVR-Change generation speed: images/s with 1 and 2 workers at the default 240x160, side by side.

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

TARGET = 12.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=120)
    ap.add_argument("--size", default="240x160")
    args = ap.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2):
            out = Path(tmp) / f"w{workers}"
            t0 = time.perf_counter()
            generate(out, n_pairs=args.pairs, seed=0, size=size, workers=workers, progress=False)
            rates[workers] = 3 * args.pairs / (time.perf_counter() - t0)
            shutil.rmtree(out)
    print(f"SynthCLEVR-Change at {size[0]}x{size[1]}, {args.pairs} pairs ({3 * args.pairs} images):")
    for w, r in rates.items():
        print(f"  workers={w}: {r:6.1f} images/s")
    print(f"  2-worker speedup over 1: {rates[2] / rates[1]:.2f}x")
    print(f"  2 workers vs the {TARGET:.0f} images/s target: {rates[2] / TARGET:.2f}x")


if __name__ == "__main__":
    main()
