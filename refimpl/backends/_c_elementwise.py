"""Element-wise and row-wise C kernels: the validated wrappers of ``refimpl_gelu_f64`` and ``refimpl_erf_f64``
(ckernels/gelu.c) and of ``refimpl_layer_norm_f64`` (ckernels/layernorm.c).

- ``"gelu"``: ``gelu(x, approximate="none", *, out=None, threads=None)``, the C twin of
  ``refimpl.numerics.gelu`` (the definition, registered by ``refimpl.layers``), float64 only, with the
  vectorisable erf of ckernels/erf_vec.h;
- ``gelu_libm`` (not registered): the same with libm's scalar erf, the plain version kept beside the fast
  one for tests and timing;
- ``erf(x, impl="vector" | "libm")`` (not registered): the erf alone, for its accuracy tests;
- ``"layer_norm"``: ``layer_norm(x, weight=None, bias=None, eps=..., *, threads=None)``, the C twin of
  ``refimpl.layers.layer_norm`` (the definition), float64; ``layer_norm_plain`` (not registered) its plain
  version, one thread, sums in the recursive order;
- ``"l2_normalize"``: ``l2_normalize(x, eps, policy, *, threads=None)``, the C twin of
  ``refimpl.numerics.l2_normalize`` over the last axis (ckernels/l2norm.c), float64; ``l2_normalize_plain`` its
  plain version.

The same steps as every wrapper of refimpl.backends._c: validate (float64 in native byte order, non-empty,
at least one dimension; a non-contiguous input is copied to C order; ``out`` refused unless usable as is),
fill the output with NaN, pass the buffers with ``ffi.from_buffer``, check the returned status.  The
compiled module is the one of refimpl.backends._c (loaded on first use).  This module imports nothing from
refimpl.attention, refimpl.layers or refimpl.models.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _validate
from ._c import _check_status, _load, _outside_band, _threads, run_kernel
from ._registry import definition, register
from ._validate import empty_aligned

#: approximate= codes of refimpl_gelu_f64 (GELU_ERF / GELU_TANH in ckernels/gelu.c).
GELU_FORMS = {"none": 0, "tanh": 1}
#: The code of the exact form with libm's erf (GELU_ERF_LIBM), and refimpl_erf_f64's impl codes.
GELU_ERF_LIBM = 2
ERF_IMPLS = {"vector": 0, "libm": 1}

_F64 = np.dtype(np.float64)


def gelu_supported(x: Any, approximate: str = "none", *_: Any, **__: Any) -> bool:
    """The ``supports`` predicate of the GELU kernels (C and Numba): a float64 ndarray in native byte order
    with at least one dimension and one element, and ``approximate`` "none" or "tanh".  Any layout (the
    wrappers copy a non-contiguous x to C order).  Everything else - float32 (under numerics.precision),
    other dtypes, Python scalars and 0-d arrays (the definition returns a NumPy scalar for those), empty
    arrays and unknown forms (the definition raises) - runs on the NumPy definition."""
    return (isinstance(x, np.ndarray) and x.dtype == _F64 and x.dtype.isnative and x.ndim >= 1 and x.size >= 1
            and isinstance(approximate, str) and approximate in GELU_FORMS)


def gelu_args(x: Any, approximate: Any, out: Any, backend: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Check the arguments of a GELU kernel: (x as a C-contiguous float64 array, out or None).  ``out`` must
    be a C-contiguous, aligned, writeable float64 array of x's shape; it may be x itself (exactly the same
    buffer and layout: the map is element-wise, so in place is safe), but no other array sharing memory
    with x."""
    if not isinstance(approximate, str) or approximate not in GELU_FORMS:
        raise ValueError(f"argument 'approximate': expected 'none' or 'tanh', got {approximate!r}")
    a = _validate._array(x, "x", backend)
    if a.dtype != _F64:
        raise TypeError(f"argument 'x': the {backend} GELU kernel takes float64, got {a.dtype} (float32 runs on "
                        f"the NumPy definition: refimpl.layers.gelu's predicate sends it there)")
    if a.ndim < 1 or a.size < 1:
        raise ValueError(f"argument 'x': expected a non-empty array with at least one dimension, got shape "
                         f"{a.shape}")
    if out is not None:
        same = (isinstance(out, np.ndarray) and isinstance(x, np.ndarray) and out.shape == a.shape
                and out.dtype == a.dtype and a.flags.c_contiguous and out.flags.c_contiguous
                and out.ctypes.data == a.ctypes.data)
        _validate._check_out(out, a.dtype, a.shape, () if same else (("x", a),), "x")
    return _validate._contiguous(a), out


@register("gelu", "c", supports=gelu_supported)
def gelu(x: np.ndarray, approximate: str = "none", *, out: np.ndarray | None = None,
         threads: int | None = None) -> np.ndarray:
    """GELU in C: the C twin of ``refimpl.numerics.gelu`` (float64).

    approximate="none": y = (0.5 x) (1 + erf(x / sqrt 2)) with the branch-free, vectorised erf of
    ckernels/erf_vec.h (within about 1 ulp; ``gelu_libm`` uses libm's); "tanh": y = (0.5 x)
    (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) with libm's tanh.  The definition's operations in its order
    (ckernels/gelu.c), so the result differs from it only through erf (tanh), within
    ``refimpl.layers.gelu_bound``, and the IEEE special values are the definition's: +-0 -> +-0,
    +Inf -> +Inf, -Inf -> NaN (-Inf * 0, as the definition), NaN -> NaN, x << 0 -> -0.

    Parameters
    ----------
    x : float64 array, any non-empty shape with at least one dimension (copied to C order if it is not).
    approximate : "none" | "tanh".
    out : optional float64 array of x's shape, C-contiguous, aligned, writeable; x itself (in place) or an
        array sharing no memory with x.  Written and returned (allocated 64-byte aligned if None).
    threads : int >= 1 or None (refimpl.backends._c.default_threads()).  Speed only: the map is
        element-wise, every thread count gives the same bits; calls under 32768 elements use one thread.

    Returns
    -------
    float64 array of x's shape (C order).

    Raises
    ------
    TypeError for a dtype other than float64; ValueError for an empty or 0-d x, an unknown form, an unusable
    ``out`` or bad ``threads``; ImportError if the compiled module is missing; RuntimeError if the kernel
    refuses its arguments (a validation bug).

    References
    ----------
    Hendrycks & Gimpel, "Gaussian Error Linear Units (GELUs)" (2016), Sec. 2 (exact form and the tanh
    approximation); PyTorch ``torch.nn.functional.gelu``.
    """
    return _run(x, approximate, out, threads, None)


def _run(x: Any, approximate: Any, out: Any, threads: Any, code: int | None) -> np.ndarray:
    """Validate, allocate / poison the output, call refimpl_gelu_f64 with ``code`` (None: the code of
    ``approximate``), check the status."""
    mod = _load()
    nthreads = _threads(threads)
    a, out = gelu_args(x, approximate, out, "C")
    code = GELU_FORMS[approximate] if code is None else code
    result = out if out is not None else empty_aligned(a.shape, a.dtype)
    if not np.may_share_memory(result, a):   # (in place, the input is the poison's victim: no fill)
        result.fill(np.nan)  # poison: an element the kernel does not write stays NaN
    ffi, lib = mod.ffi, mod.lib
    status = lib.refimpl_gelu_f64(ffi.from_buffer("double[]", result, require_writable=True),
                                  ffi.from_buffer("double[]", a), a.size, code, nthreads)
    _check_status(mod, status, "refimpl_gelu")
    return result


def gelu_libm(x: np.ndarray, *, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """GELU (exact form) in C with libm's scalar erf: the plain version beside the vectorised ``gelu`` (for
    tests and timing; not registered).  Arguments, results and errors as ``gelu``."""
    return _run(x, "none", out, threads, GELU_ERF_LIBM)


def erf(x: np.ndarray, impl: str = "vector") -> np.ndarray:
    """erf(x), element-wise, float64: ``impl="vector"`` the branch-free erf of the GELU kernel
    (ckernels/erf_vec.h, at the instruction-set level in use), ``"libm"`` libm's erf.  For the accuracy
    tests; not registered.  x as ``gelu`` takes it; returns a new array of x's shape."""
    if not isinstance(impl, str) or impl not in ERF_IMPLS:
        raise ValueError(f"argument 'impl': expected 'vector' or 'libm', got {impl!r}")
    mod = _load()
    a, _ = gelu_args(x, "none", None, "C")
    result = empty_aligned(a.shape, a.dtype)
    result.fill(np.nan)
    ffi, lib = mod.ffi, mod.lib
    status = lib.refimpl_erf_f64(ffi.from_buffer("double[]", result, require_writable=True),
                                 ffi.from_buffer("double[]", a), a.size, ERF_IMPLS[impl])
    _check_status(mod, status, "refimpl_erf")
    return result


# ---------------------------------------------------------------------------------------------------
# LayerNorm (ckernels/layernorm.c)
# ---------------------------------------------------------------------------------------------------

def layer_norm_supported(x: Any, weight: Any = None, bias: Any = None, *_: Any, **__: Any) -> bool:
    """The ``supports`` predicate of the C LayerNorm: x a float64 ndarray in native byte order with at least one
    dimension and one element, weight and bias None or float64 ndarrays.  Any layout (the wrapper copies to C
    order).  Everything else (float32 under numerics.precision, ...) runs on the definition, which also gives
    the errors for bad arguments."""
    def vec(a: Any) -> bool:
        return a is None or (isinstance(a, np.ndarray) and a.dtype == _F64 and a.dtype.isnative)
    return (isinstance(x, np.ndarray) and x.dtype == _F64 and x.dtype.isnative and x.ndim >= 1 and x.size >= 1
            and vec(weight) and vec(bias))


@register("layer_norm", "c", supports=layer_norm_supported)
def layer_norm(x: np.ndarray, weight: np.ndarray | None = None, bias: np.ndarray | None = None,
               eps: float = 1e-5, *, threads: int | None = None) -> np.ndarray:
    """LayerNorm over the last axis in C: the C twin of ``refimpl.layers.layer_norm`` (float64).

    Per row, the definition's operations in its order (mean, differences, mean of squares, quotient by
    sqrt(var + eps), scale, shift; ckernels/layernorm.c), the two sums in interleaved partial sums instead of
    NumPy's pairwise order: within ``refimpl.layers.layer_norm_bound`` of the exact result, as the definition
    is, not bit for bit.  Where x, weight or bias holds an entry above 2^256 or an infinite one (the kernels'
    band, refimpl.backends._c), the result is the definition's; a row holding a NaN is NaN, as in the
    definition.

    Parameters
    ----------
    x : float64 array (..., C), non-empty, copied to C order if it is not.  weight, bias : float64 (C,) or None.
    eps : finite and >= 0.  threads : int >= 1 or None (refimpl.backends._c.default_threads()); speed only,
        every thread count gives the same bits; calls under 262144 elements use one thread.

    Returns
    -------
    A new float64 array of x's shape (C order).

    Raises
    ------
    TypeError for a dtype other than float64; ValueError for an empty or 0-d x, a weight / bias of another
    shape than (C,), an eps that is not finite and >= 0, or bad ``threads``; ImportError if the compiled module
    is missing.

    References
    ----------
    Ba, Kiros & Hinton, "Layer Normalization" (2016), Eq. 4; PyTorch ``torch.nn.LayerNorm``; Higham (2002)
    eq. 4.4 (the sums' error in any order).
    """
    return _layer_norm(x, weight, bias, eps, threads, plain=False)


def layer_norm_plain(x: np.ndarray, weight: np.ndarray | None = None, bias: np.ndarray | None = None,
                     eps: float = 1e-5) -> np.ndarray:
    """The plain C LayerNorm (one thread, both sums in the recursive order): the specification beside
    ``layer_norm`` (not registered).  Arguments, results and errors as ``layer_norm``."""
    return _layer_norm(x, weight, bias, eps, 1, plain=True)


def layer_norm_args(x: Any, weight: Any, bias: Any, eps: Any, backend: str
                    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, float]:
    """Check the arguments of a LayerNorm kernel (C or Numba): (x, weight, bias as C-contiguous float64 arrays or
    None, eps as a float)."""
    a = _rows(x, backend, "LayerNorm kernel", "C")
    n = a.shape[-1]
    vecs = []
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None:
            v = _validate._array(v, name, backend)
            if v.dtype != _F64 or v.shape != (n,):
                raise ValueError(f"argument '{name}': expected a float64 array of shape ({n},), got {v.dtype} "
                                 f"{v.shape}")
            v = _validate._contiguous(v)
        vecs.append(v)
    return a, vecs[0], vecs[1], _check_eps(eps)


def _rows(x: Any, backend: str, kernel: str, last: str) -> np.ndarray:
    """``x`` for a row-wise kernel: a non-empty float64 array of at least one dimension (rows along the last axis,
    of length ``last``), in C order; TypeError / ValueError naming 'x' otherwise (float32 runs on the definition:
    the kernels' predicates send it there)."""
    a = _validate._array(x, "x", backend)
    if a.dtype != _F64:
        raise TypeError(f"argument 'x': the {backend} {kernel} takes float64, got {a.dtype} (float32 runs on the "
                        f"NumPy definition: the operation's predicate sends it there)")
    if a.ndim < 1 or a.size < 1:
        raise ValueError(f"argument 'x': expected a non-empty array (..., {last}), got shape {a.shape}")
    return _validate._contiguous(a)


def _check_eps(eps: Any) -> float:
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, (int, float, np.integer, np.floating)) or \
            not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"argument 'eps': expected a finite number >= 0, got {eps!r}")
    return float(eps)


def _layer_norm(x: Any, weight: Any, bias: Any, eps: Any, threads: Any, plain: bool) -> np.ndarray:
    nthreads = _threads(threads)
    a, w, b, eps = layer_norm_args(x, weight, bias, eps, "C")
    n = a.shape[-1]
    rows = a.size // n

    def twin() -> np.ndarray:              # the definition, as refimpl.layers registered it
        return definition("layer_norm")(a, w, b, float(eps))

    result = empty_aligned(a.shape, a.dtype)
    if plain:
        return run_kernel("layer_norm_plain", result, a, w, b, rows, n, float(eps), twin=twin, band=(a, w, b))
    if _outside_band(w, b):
        return twin()
    # The fast kernel writes every element of every row it computes (no poison needed: its loops cover the
    # row) and counts, instead of computing, the rows with an entry above 2^256 or an infinite one (its first
    # pass finds them: no separate range scan); then the call is the definition's.  Its only non-finite outputs
    # are the rows holding a NaN, NaN in the definition too (no range fallback needed).
    mod = _load()
    ffi = mod.ffi
    flagged = ffi.new("int64_t[1]")
    arg = lambda v: ffi.NULL if v is None else ffi.from_buffer("double[]", v)
    _check_status(mod, mod.lib.refimpl_layer_norm_f64(ffi.from_buffer("double[]", result, require_writable=True),
                                                      flagged, arg(a), arg(w), arg(b), rows, n, float(eps),
                                                      nthreads), "refimpl_layer_norm")
    return twin() if flagged[0] else result


# ---------------------------------------------------------------------------------------------------
# L2 normalisation over the last axis (ckernels/l2norm.c)
# ---------------------------------------------------------------------------------------------------

#: policy codes of refimpl_l2_normalize_f64.
L2_POLICIES = {"clamp": 0, "add": 1, "none": 2}


def l2_normalize_supported(x: Any, eps: Any = None, policy: Any = "clamp", *_: Any, **__: Any) -> bool:
    """The ``supports`` predicate of the C L2 normalisation: a float64 ndarray in native byte order with at least one
    dimension and one element, and a known policy; everything else runs on the definition."""
    return (isinstance(x, np.ndarray) and x.dtype == _F64 and x.dtype.isnative and x.ndim >= 1 and x.size >= 1
            and isinstance(policy, str) and policy in L2_POLICIES)


@register("l2_normalize", "c", supports=l2_normalize_supported)
def l2_normalize(x: np.ndarray, eps: float, policy: str = "clamp", *, threads: int | None = None) -> np.ndarray:
    """x / ||x|| over the last axis in C: the C twin of ``refimpl.numerics.l2_normalize(x, -1, eps, policy)``
    (float64): per row the definition's operations in its order (the maximum, the scaled squares' sum, the
    scaled norm, the policy's denominator, the quotient; ckernels/l2norm.c), the sum in four interleaved partial
    sums: within ``refimpl.layers.l2_normalize_bound`` of the exact result, as the definition is, with its special
    values (a NaN row NaN, an infinite entry's row 0 and NaN, a zero row 0 or NaN by the policy).

    Parameters
    ----------
    x : float64 array (..., d), non-empty (copied to C order if it is not).  eps : finite and >= 0.  policy :
        "clamp" | "add" | "none".  threads : int >= 1 or None (refimpl.backends._c.default_threads()); speed
        only, every thread count gives the same bits; calls under 262144 elements use one thread.

    Returns
    -------
    A new float64 array of x's shape (C order).

    Raises
    ------
    TypeError for a dtype other than float64; ValueError for an empty or 0-d x, an eps that is not finite and
    >= 0, an unknown policy or bad ``threads``; ImportError if the compiled module is missing.

    References
    ----------
    Anderson, "Algorithm 978: Safe scaling in the Level 1 BLAS" (2017) (dnrm2's scaling); torch.nn.functional.
    normalize ("clamp").
    """
    return _l2_normalize(x, eps, policy, threads, plain=False)


def l2_normalize_plain(x: np.ndarray, eps: float, policy: str = "clamp") -> np.ndarray:
    """The plain C L2 normalisation (one thread, the sum in the recursive order): the specification beside
    ``l2_normalize`` (not registered).  Arguments, results and errors as ``l2_normalize``."""
    return _l2_normalize(x, eps, policy, 1, plain=True)


def l2_normalize_args(x: Any, eps: Any, policy: Any, backend: str) -> tuple[np.ndarray, float, str]:
    """Check the arguments of an L2-normalisation kernel (C or Numba): (x C-contiguous float64, eps, policy)."""
    if not isinstance(policy, str) or policy not in L2_POLICIES:
        raise ValueError(f"argument 'policy': expected 'clamp', 'add' or 'none', got {policy!r}")
    eps = _check_eps(eps)
    return _rows(x, backend, "L2 normalisation", "d"), eps, policy


def _l2_normalize(x: Any, eps: Any, policy: Any, threads: Any, plain: bool) -> np.ndarray:
    nthreads = _threads(threads)
    a, eps, policy = l2_normalize_args(x, eps, policy, "C")
    d = a.shape[-1]
    result = empty_aligned(a.shape, a.dtype)
    # Every row is written by the kernel's loops (no poison needed) and its non-finite outputs are the definition's
    # (the same operations on the same special values; no range fallback: the scaled norm cannot overflow).
    mod = _load()
    ffi = mod.ffi
    args = (ffi.from_buffer("double[]", result, require_writable=True), ffi.from_buffer("double[]", a),
            a.size // d, d, float(eps), L2_POLICIES[policy])
    if plain:
        status, name = mod.lib.refimpl_l2_normalize_plain_f64(*args), "refimpl_l2_normalize_plain"
    else:
        status, name = mod.lib.refimpl_l2_normalize_f64(*args, nthreads), "refimpl_l2_normalize"
    _check_status(mod, status, name)
    return result
