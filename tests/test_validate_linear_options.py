"""One option check for the fused linear-attention kernels (refimpl.backends._validate.linear_attention_options).

The fast C wrapper (refimpl.backends._c_linear: linear_attention, reweighted_linear_attention) and its plain
specification (refimpl.backends._c_plain) validate the focusing factor p, the feature map, the normaliser policy
(eps, eps_policy, clamp_min), the key weights and the V scale by that one function.  Pinned here:

1. the two wrappers refuse every bad option with the same exception and the same message (the fast wrapper's
   feature-map message adds where other maps run), and the messages themselves;
2. the order of the checks (options, then the fast wrapper's thread count, then the arrays), so that a call
   with several bad arguments names the same one as before;
3. the validated values: the C option struct's fields, key weights and V scale in the kernel's layout.
"""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.backends import _c_linear, _c_plain, _validate
from tests.kernel_helpers import backend_available

RNG = np.random.default_rng(7)
Q, K, V = (RNG.standard_normal((2, 3, 5, 4)) for _ in range(3))
ALPHA = RNG.random((2, 3, 5)) + 0.5

_MAP_NOTE = " (other maps run on the NumPy definition)"

#: (keyword arguments of linear_attention, exception, exact message of the plain wrapper)
BAD_OPTIONS = [
    (dict(feature_map="softmax"), ValueError,
     "argument 'feature_map': the C kernel implements ('relu', 'elu1', 'focused'), got 'softmax'"),
    (dict(eps_policy="max"), ValueError, "argument 'eps_policy': expected 'add' or 'clamp', got 'max'"),
    (dict(eps="0"), TypeError, "argument 'eps': expected a real number, got str"),
    (dict(eps=True), TypeError, "argument 'eps': expected a real number, got bool"),
    (dict(clamp_min=[1.0]), TypeError, "argument 'clamp_min': expected a real number or None, got list"),
    (dict(p=0.5), ValueError, "argument 'p': expected a finite focusing factor p >= 1, got 0.5"),
    (dict(p="3"), TypeError, "argument 'p': expected a real number (the focusing factor), got str"),
    (dict(v_scale=np.ones(2)), ValueError, "argument 'v_scale': expected 1 value or one per head (3), got shape (2,)"),
    (dict(v_scale=np.ones(3, np.float32)), TypeError,
     "argument 'v_scale': expected dtype float64 (the dtype of 'q'), got float32; the C kernel does not mix "
     "precisions"),
    (dict(v_scale=np.ones(3), v_scale_mode="add"), ValueError,
     "argument 'v_scale_mode': expected 'divide' or 'multiply', got 'add'"),
    # several bad arguments: the first in the order of linear_attention_options is named
    (dict(feature_map="softmax", eps="x", p=0.1), ValueError,
     "argument 'p': expected a finite focusing factor p >= 1, got 0.1"),
    (dict(eps="x", clamp_min="y"), TypeError, "argument 'eps': expected a real number, got str"),
    (dict(eps_policy="max", q=Q[0]), ValueError, "argument 'eps_policy': expected 'add' or 'clamp', got 'max'"),
    (dict(v_scale=np.ones(7), v_scale_mode="x", q=Q[0]), ValueError,
     "argument 'q': expected a 4-d array of shape (B, h, N, d), got 3-d shape (3, 5, 4)"),
]

#: (alpha, exception, exact message) for the reweighted form's key weights
BAD_ALPHA = [
    (ALPHA[:, :, :4], ValueError, "argument 'alpha': expected shape (2, 3, 5) (B, h, M), got (2, 3, 4)"),
    (ALPHA.astype(np.float32), TypeError,
     "argument 'alpha': expected dtype float64 (the dtype of 'q'), got float32; the C kernel does not mix "
     "precisions"),
]


def _raised(fn, *args, **kwargs):
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    return info.type, str(info.value)


def _split(kwargs):
    kw = dict(kwargs)
    arrays = [kw.pop(n, a) for n, a in (("q", Q), ("k", K), ("v", V))]
    return arrays, kw


@pytest.mark.parametrize("kwargs,exc,message", BAD_OPTIONS, ids=[str(i) for i in range(len(BAD_OPTIONS))])
def test_fast_and_plain_wrappers_refuse_bad_options_alike(kwargs, exc, message):
    """The same exception and message from both wrappers (one check); the fast one's feature-map message says
    where other maps run."""
    if not backend_available("c", "linear_attention"):
        return
    arrays, kw = _split(kwargs)
    assert _raised(_c_plain.linear_attention, *arrays, **kw) == (exc, message)
    fast = message + (_MAP_NOTE if message.startswith("argument 'feature_map'") else "")
    assert _raised(_c_linear.linear_attention, *arrays, **kw) == (exc, fast)


@pytest.mark.parametrize("alpha,exc,message", BAD_ALPHA, ids=["shape", "dtype"])
def test_fast_and_plain_wrappers_refuse_bad_key_weights_alike(alpha, exc, message):
    if not backend_available("c", "linear_attention"):
        return
    assert _raised(_c_plain.reweighted_linear_attention, Q, K, V, alpha) == (exc, message)
    assert _raised(_c_linear.reweighted_linear_attention, Q, K, V, alpha) == (exc, message)


def test_thread_count_is_checked_after_the_options_and_before_the_arrays():
    if not backend_available("c", "linear_attention"):
        return
    assert _raised(_c_linear.linear_attention, Q, K, V, eps="x", threads=0) == (
        TypeError, "argument 'eps': expected a real number, got str")
    assert _raised(_c_linear.linear_attention, Q[0], K, V, threads=0) == (
        ValueError, "argument 'threads': expected an integer >= 1 or None, got 0")


def test_both_wrappers_validate_through_the_one_function(monkeypatch):
    """Each call of either wrapper's linear attention runs linear_attention_options exactly once."""
    if not backend_available("c", "linear_attention"):
        return
    calls = []
    orig = _validate.linear_attention_options

    def counting(*args, **kwargs):
        calls.append(1)
        return orig(*args, **kwargs)

    monkeypatch.setattr(_validate, "linear_attention_options", counting)
    for fn in (_c_linear.linear_attention, _c_plain.linear_attention):
        fn(Q, K, V, "relu")
    for fn in (_c_linear.reweighted_linear_attention, _c_plain.reweighted_linear_attention):
        fn(Q, K, V, ALPHA)
    assert len(calls) == 4


def test_validated_values_and_c_option_fields():
    """The option struct's fields (codes of ckernels/refimpl_kernels.h), the V scale broadcast to one value per
    head bh, the key weights as given (C-contiguous), the thread check's value returned."""
    vs = np.array([2.0, 3.0, 0.5])
    o = _validate.linear_attention_options(Q, K, V, None, None, "focused", 1e-3, "clamp", 0.25, 2, vs,
                                           "multiply", threads_check=lambda: 5)
    assert o.c_options(0.5) == {"feature_map": 2, "eps_policy": 1, "clamp": 1, "v_scale_divide": 0, "power": 2.0,
                                "clamp_min": 0.25, "eps": 1e-3, "kv_scale": 0.5}
    assert isinstance(o.power, float) and o.threads == 5 and o.key_weight is None
    np.testing.assert_array_equal(o.v_scale, np.broadcast_to(vs, (2, 3)))
    assert o.v_scale.flags.c_contiguous and o.arrays.q.shape == (6, 5, 4)

    alpha_t = np.asfortranarray(ALPHA)
    o = _validate.linear_attention_options(Q, K, V, None, alpha_t, "elu1", 0, "add", None, 3.0, None, "divide")
    assert o.c_options(1) == {"feature_map": 1, "eps_policy": 0, "clamp": 0, "v_scale_divide": 1, "power": 3.0,
                              "clamp_min": 0.0, "eps": 0.0, "kv_scale": 1.0}
    assert o.threads is None and o.v_scale is None
    assert o.key_weight.flags.c_contiguous
    np.testing.assert_array_equal(o.key_weight, ALPHA)
    assert _c_linear.LINEAR_ATTENTION_MAPS is _validate.LINEAR_ATTENTION_MAPS


@pytest.mark.parametrize("bad,err", [(dict(eps=float("nan")), "argument 'eps': expected a finite real number, got nan"),
                                     (dict(eps=float("inf")), "argument 'eps': expected a finite real number"),
                                     (dict(clamp_min=float("nan"), eps_policy="clamp"),
                                      "argument 'clamp_min': expected a finite real number, got nan")])
def test_non_finite_options_are_refused_before_c(bad, err):
    """A NaN or infinite eps / clamp_min never reaches the C kernel (it would give NaN for finite input)."""
    o = _validate.linear_attention_options
    q = np.ones((1, 1, 2, 2))
    kw = dict(q=q, k=q, v=q, out=None, key_weight=None, feature_map="relu", eps=0.0, eps_policy="add",
              clamp_min=None, p=3.0, v_scale=None, v_scale_mode="divide")
    kw.update(bad)
    with pytest.raises(ValueError, match=err.replace("(", r"\(")):
        o(**kw)


@pytest.mark.parametrize("kv", ["2", True, float("nan")])
def test_kv_scale_is_checked(kv):
    q = np.ones((1, 1, 2, 2))
    opts = _validate.linear_attention_options(q, q, q, None, None, "relu", 0.0, "add", None, 3.0, None, "divide")
    with pytest.raises((TypeError, ValueError), match="argument 'kv_scale'"):
        opts.c_options(kv)
