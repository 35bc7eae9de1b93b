"""tests/numeric.py: the one relative-plus-absolute comparison, and a guard that no test compares any other way."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from numeric import assert_close, assert_differ, is_close


def logits_up_to_14() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 12, generator=g)
    return 14 * x / x.abs().max()


def test_rounding_on_large_logits_passes():
    """The case that failed on another 2-core machine: max |diff| 1.01e-05 on logits up to 14 (rel. 7e-7)."""
    want = logits_up_to_14()
    got = want.clone()
    got[0, 0] += 1.01e-5
    assert float((got - want).abs().max()) > 1e-5                    # a fixed atol of 1e-5 failed this
    assert_close(got, want)
    noisy = want * (1 + 1e-6 * torch.randn(want.shape, generator=torch.Generator().manual_seed(1)))
    assert_close(noisy, want)                                       # float32 rounding of any BLAS, everywhere


def test_a_wrong_tensor_fails_and_says_by_how_much():
    want = logits_up_to_14()
    for wrong in (want.flip(-1), want * 1.01, torch.where(want.abs() == want.abs().max(), want.neg(), want)):
        with pytest.raises(AssertionError, match=r"max abs error .*max rel error .*scale 14"):
            assert_close(wrong, want, what="logits")
    small = want.clone()
    small[2, 3] += 1e-3                                             # one element 7e-5 of the scale off
    assert not is_close(small, want)
    with pytest.raises(AssertionError, match="logits: not close"):
        assert_close(small, want, what="logits")
    assert_differ(want * 1.01, want)
    with pytest.raises(AssertionError, match="unexpectedly close"):
        assert_differ(want, want.clone())


def test_near_zero_expected_is_judged_relative_to_the_operands():
    """A near-zero reference does not make any small value pass: the scale is the data's, not a fixed floor."""
    want = torch.full((5,), 1e-8)
    assert_close(want * (1 + 1e-6), want)
    with pytest.raises(AssertionError, match="scale 1e-08"):
        assert_close(want + 1e-6, want)                               # 100x off, yet within a fixed atol of 1e-5
    # a sum of probabilities minus one: rounding is relative to the operands (1), so the caller says so
    p = torch.softmax(torch.randn(3, 7, generator=torch.Generator().manual_seed(2)), -1)
    residual = p.sum(-1) - 1
    assert_close(residual, torch.zeros(3), scale=1.0)
    with pytest.raises(AssertionError):
        assert_close(residual + 1e-3, torch.zeros(3), scale=1.0)
    with pytest.raises(AssertionError):
        assert_close(torch.full((3,), 1e-12), torch.zeros(3))         # exact zero with no scale: exact


def test_shapes_dtypes_non_finite_and_plain_numbers():
    with pytest.raises(AssertionError, match="shape"):
        assert_close(torch.zeros(3), torch.zeros(1, 3))
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(torch.zeros(3), torch.zeros(3, dtype=torch.float64))
    assert_close(torch.zeros(3), torch.zeros(3, dtype=torch.float64), check_dtype=False)
    assert not is_close(torch.tensor([float("nan")]), torch.tensor([float("nan")]))
    assert_close(torch.tensor([float("inf"), 1.0]), torch.tensor([float("inf"), 1.0]))
    assert not is_close(torch.tensor([float("inf")]), torch.tensor([1.0]))
    assert_close(np.float32(0.1) * 3, 0.3, rtol=1e-6)
    assert_close(torch.ones(2, 3) * (1 + 1e-7), 1.0)                # a number stands for every element
    assert_close(np.full(3, 2.0, dtype=np.float16), np.full(3, 2.001, dtype=np.float16))   # float16's own rtol
    assert not is_close(2.0 + 1e-9, 2.0)                              # float64: 1e-10 relative


# What a raw comparison looks like: a library's allclose/isclose/assert_close, or a value held to a fixed absolute
# threshold (`< 1e-5`, `atol=1e-5`). tests/numeric.py is the only place that may compare this way.
RAW = re.compile(r"allclose\(|isclose\(|testing\.assert_close\(|[<>]=?\s*\d*\.?\d+e-\d+|\batol\s*=|abs\s*=\s*\d*\.?\d+e-")


def test_no_test_compares_numbers_outside_the_helper():
    here = Path(__file__).parent
    found = [f"{p.name}:{n}: {line.strip()}" for p in sorted(here.glob("*.py")) if p.name not in ("numeric.py",
             Path(__file__).name) for n, line in enumerate(p.read_text().splitlines(), 1) if RAW.search(line)]
    assert not found, "compare with tests/numeric.py's assert_close instead:\n" + "\n".join(found)
