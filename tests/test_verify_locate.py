"""refimpl.verify.locate.locate: which recorded tensor is taken for a stage located by value.  The tensors the
stage's own bound allows (its ``Bound.array(dtype, shape)``) tie, and the last of them is taken; outside it, or
where the bound is void, only the closest tensor and its exact copies.  Each test would fail with the former
fixed tie of 16 u_T in relative Frobenius distance: a legitimate rounding difference larger than that not tied
(too tight), a difference beyond the bound at one element tied (too loose)."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.verdict import Bound, round_to, unit_roundoff
from refimpl.verify.locate import conclusive, locate, within

N = 64          # inner-product length of the stage below


def _stage(dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(reference, its element-wise bound in ``dtype``) of a matrix product stage A B with N-term inner
    products on ``dtype`` operands: Higham's gamma_N |A||B| in T plus the float64 reference's own."""
    rng = np.random.default_rng(seed)
    a = round_to(rng.standard_normal((4, 50, N)), dtype)
    b = round_to(rng.standard_normal((N, 60)), dtype)
    ref = a @ b
    bound = Bound(np.abs(a) @ np.abs(b), N, "matmul", accumulation=True).array(dtype, ref.shape)
    return ref, bound


def _old_tie(pool, ref, dtype):
    """The former rule: of the tensors within 2 x the best distance + 16 u_T (relative Frobenius), the last."""
    nr = float(np.sqrt(np.sum(ref ** 2)))
    d = [float(np.sqrt(np.sum((f - ref) ** 2))) / nr for _, f in pool]
    close = [i for i, x in enumerate(d) if x <= 2 * min(d) + 16 * unit_roundoff(dtype)]
    return max(close)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_later_tensor_within_the_stages_bound_is_taken(dtype):
    """The reference itself first, then a value 0.9 of the stage's bound away at every element (a legitimate
    evaluation in T as far as the error model tells, e.g. den -> den + eps below the rounding): both are the stage,
    the later one is taken and the first position returned.  In float32 (the 64-term sums accumulated in T) its
    distance is some 280 u_T, above the former 16 u_T tie, which took the first (too tight)."""
    ref, bnd = _stage(dtype)
    late = ref + 0.9 * bnd * np.sign(np.sin(np.arange(ref.size))).reshape(ref.shape)
    pool = [("#0 matmul", ref.copy()), ("#1 add", late)]
    arr, label, _d, first = locate(pool, ref, bnd)
    assert label.startswith("#1 add") and np.array_equal(arr, late) and first == 0, label
    if dtype == "float32":
        assert _old_tie(pool, ref, dtype) == 0
    arr, label, _d, first = locate(pool, ref)       # no bound: only the closest
    assert label.startswith("#0 matmul") and first == 0, label


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_later_tensor_beyond_the_bound_at_one_element_is_not_taken(dtype):
    """A later tensor equal to the reference but at one element, 1.1 of its bound away there: no legitimate
    evaluation differs so, the reference is taken.  Its relative Frobenius distance is a few u_T at most, below
    the former 16 u_T tie, which took it (too loose).  At 0.9 of the bound it is the stage again."""
    ref, bnd = _stage(dtype)
    i = np.unravel_index(int(np.argmin(bnd)), ref.shape)
    for factor, taken in ((1.1, "#0"), (0.9, "#1")):
        late = ref.copy()
        late[i] += factor * bnd[i]
        pool = [("#0 matmul", ref.copy()), ("#1 add", late)]
        _arr, label, _d, first = locate(pool, ref, bnd)
        assert label.startswith(taken) and first == 0, (factor, label)
        if factor > 1:
            assert _old_tie(pool, ref, dtype) == 1


def test_a_void_bound_ties_nothing_but_exact_copies():
    """A bound infinite at one element, or as large as the quantity, cannot tell a legitimate value from another:
    not conclusive, and then the closest tensor is taken with its exact copies only."""
    ref, bnd = _stage("float32")
    late = ref + 0.5 * bnd
    for void in (np.where(np.arange(ref.size).reshape(ref.shape) == 3, np.inf, bnd), 2 * np.abs(ref) + 1.0):
        assert not conclusive(void, ref) and within(late, ref, void)
        _arr, label, _d, first = locate([("#0", ref.copy()), ("#1", late), ("#2", ref.copy())], ref, void)
        assert label.startswith("#2") and first == 0, label
    assert conclusive(bnd, ref)


def test_an_exact_copy_in_another_layout_is_not_skipped_by_the_norm_test():
    """An exact copy of the reference stored in another axis order has the same values and norm, but its float64
    norm is summed in another order and differs by a rounding: the cheap norm test allows gamma_{n+1}(u_64) for
    that, so the copy ties with the first (distance 0 both) and is taken."""
    ref = np.random.default_rng(0).standard_normal((5, 123, 7))
    copy = np.ascontiguousarray(ref.transpose(2, 1, 0))
    assert float(np.sqrt(np.sum(copy ** 2))) != float(np.sqrt(np.sum(ref ** 2)))   # the case the slack is for
    _arr, label, d, first = locate([("#0", ref.copy()), ("#1", copy)], ref)
    assert label.startswith("#1") and d == 0.0 and first == 0, label
