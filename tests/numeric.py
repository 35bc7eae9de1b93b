"""The one numeric comparison the tests use.

A value agrees with its reference when, element by element,

    |actual - expected| <= atol + rtol * |expected|,   atol = rtol * scale,   scale = max |expected|

so the absolute part is sized from the data: a float32 network whose logits reach 14 carries rounding near 1e-5
(under 1e-6 of that magnitude, more or less depending on the BLAS and thread count of the machine),
and an absolute tolerance fixed at 1e-5 fails it on one machine and passes it on another. Sizing from the data
passes that noise and still fails a real mismatch, which moves values by a share of their scale, not by ulps.

Where the reference is (near) zero but the operands that produced it were not (a sum of probabilities minus one,
a difference of two activations), pass their magnitude as ``scale=``: rounding is relative to the operands, not to
the result (tests/test_numeric.py refuses a fixed ``atol=`` in the tests: the scale says it). The
default ``rtol`` follows the less precise operand's dtype; Python numbers count as float64, so a float read from a
float32 tensor (``.item()``) needs the rtol of the precision it was computed in.
Exact properties (bit-identical resume, argmax tokens) use ``torch.equal`` / ``==``, never this.
"""
from __future__ import annotations

import math

import numpy as np
import torch

# Per dtype of the less precise operand: a few hundred eps for float32 covers a deep network's rounding.
DEFAULT_RTOL = {torch.float16: 1e-2, torch.bfloat16: 3e-2, torch.float32: 1e-5, torch.float64: 1e-10}


def _as_tensor(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, np.ndarray | np.generic):
        return torch.from_numpy(np.asarray(x))
    return torch.as_tensor(x, dtype=torch.float64)


def _default_rtol(a: torch.Tensor, e: torch.Tensor) -> float:
    floats = [t.dtype for t in (a, e) if t.is_floating_point()]
    return max((DEFAULT_RTOL.get(d, 1e-5) for d in floats), default=0.0)


def compare(actual, expected, *, rtol: float | None = None, atol: float | None = None,
            scale: float | None = None) -> tuple[bool, str]:
    """(agree, description) under the criterion above; ``description`` gives max abs and rel error and the scale."""
    a, e = _as_tensor(actual), _as_tensor(expected)
    if not isinstance(expected, torch.Tensor | np.ndarray) and e.dim() == 0:
        e = e.expand(a.shape)                       # a Python number stands for every element
    if a.shape != e.shape:
        return False, f"shape {tuple(a.shape)} != expected {tuple(e.shape)}"
    rtol = _default_rtol(a, e) if rtol is None else rtol
    a64, e64 = a.double(), e.double()
    finite = torch.isfinite(e64)
    if scale is None:
        scale = float(e64[finite].abs().max()) if finite.any() else 0.0
    atol = rtol * scale if atol is None else atol
    diff = (a64 - e64).abs()
    same = a64 == e64                               # equal infinities agree; NaN never does
    ok = bool((same | (diff <= atol + rtol * e64.abs())).all()) if a.numel() else True
    if a.numel():
        d = torch.where(same, torch.zeros_like(diff), diff)
        worst = float(d.max()) if not d.isnan().any() else math.nan
        rel = float((d / e64.abs().clamp_min(torch.finfo(torch.float64).tiny)).max())
    else:
        worst = rel = 0.0
    return ok, (f"max abs error {worst:.3g}, max rel error {rel:.3g}, scale {scale:.3g} "
                f"(allowed {atol:.3g} + {rtol:.3g} * |expected|)")


def is_close(actual, expected, **kw) -> bool:
    return compare(actual, expected, **kw)[0]


def assert_close(actual, expected, *, rtol: float | None = None, atol: float | None = None,
                 scale: float | None = None, what: str = "", check_dtype: bool = True) -> None:
    """Fail unless ``actual`` agrees with ``expected`` (see the module docstring); dtypes must match when both are
    tensors or arrays, as torch.testing.assert_close required."""
    both = [isinstance(x, torch.Tensor) for x in (actual, expected)], [isinstance(x, np.ndarray) for x in (actual, expected)]
    if check_dtype and any(all(kind) for kind in both):
        assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != expected {expected.dtype}"
    ok, desc = compare(actual, expected, rtol=rtol, atol=atol, scale=scale)
    assert ok, f"{what + ': ' if what else ''}not close: {desc}"


def assert_differ(actual, expected, *, rtol: float | None = None, atol: float | None = None,
                  scale: float | None = None, what: str = "") -> None:
    """Fail if ``actual`` agrees with ``expected``: the same criterion, for 'this input changes that output'."""
    ok, desc = compare(actual, expected, rtol=rtol, atol=atol, scale=scale)
    assert not ok, f"{what + ': ' if what else ''}unexpectedly close: {desc}"
