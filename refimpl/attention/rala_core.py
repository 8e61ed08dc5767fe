"""RALA's mechanism: the configuration of the layer (:class:`RALAConfig`), the kernel feature map kappa, the 2-D
RoPE of the released code, the reweighting coefficients (Eq. 4), the reweighted KV buffer (Eq. 3) and the
reweighted linear attention core (Eq. 2-3, Eq. 6 before the gate) with the NumPy definitions of its
operations "rala_alpha" and "reweighted_linear_attention"; and the layout helpers (tokens <-> grid, heads,
projection weights) that the layer and the error model share.

Reference: Q. Fan, H. Huang, R. He, "Breaking the Low-Rank Dilemma of Linear Attention", CVPR 2025
(../shared/seeds/002_01b0ccc7f7225e8b.txt), §3.2, Eq. 2-4 and 6, Table 9.  Equation numbers are the paper's;
the mechanism, the presets and the numerics of kappa are stated in :mod:`refimpl.attention.rala`.

Shapes: B batch, H x W token grid, N = H W tokens (row-major), C channels, h heads, d = C / h head dim.  Per
head, q, k, v are (B, h, N, d).

Layer: attention, the bottom of RALA's three files: imports config, numerics, validation, backends (registers
the NumPy definitions of "rala_alpha" and "reweighted_linear_attention") and :mod:`.linear` (the feature map),
nothing from :mod:`.rala_recomputed`, :mod:`.rala_bounds` or :mod:`.rala`, which import it.  The public names
are re-exported by :mod:`refimpl.attention.rala`, their documented home.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from .. import backends, config, numerics, validation
from ..errors import ArgumentError, ParameterKeyError
from .linear import feature_map
from .normaliser_range import (log_features, normaliser_scaled, quotient, rebalanced_output, scaling_exponents,
                               underflow_error, underflow_rows)

__all__ = ["RALAConfig", "kappa", "rope_2d_angles", "apply_rope_2d", "reweighting_coefficients", "kv_buffer",
           "rala_core"]

# ===================================================================================================
# Configurations and presets
# ===================================================================================================

_KERNELS = ("elu1", "relu")
_GLOBAL_QUERIES = ("q", "kappa_q")
_ALPHA_SCALES = ("none", "head_dim")
_TOKEN_SCALINGS = ("sum", "mean")
_GATES = ("linear", "identity", "tanh", "none")
_GATE_SOURCES = ("separate", "qkvo")
_LAYOUTS = ("tokens", "channels_first")
_ORDERS = ("linear", "quadratic")


def _choice(value: Any, name: str, allowed: tuple) -> None:
    if value not in allowed:
        raise ArgumentError(f"RALAConfig.{name}: expected one of {allowed}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RALAConfig:
    """Options of the RALA attention layer (every departure of the released code is one field).

    Fields (paper preset value first):
    dim, num_heads : C and h; d = C / h.
    kernel : "elu1" (kappa = ELU + 1, §3.2) | "relu" (Table 9 ablation).
    reweight : True (alpha of Eq. 4 in Eq. 3) | False (alpha = 1: "w/o KV aug", Table 9).
    global_query : "q" (Q_g = mean Q, Eq. 4) | "kappa_q" (official: mean kappa(Q)).
    alpha_scale : "none" (Eq. 4) | "head_dim" (official: d^(-1/2) inside the alpha softmax).
    rope : False | True (official: 2-D RoPE on the numerator only; needs d % 4 == 0).
    rope_base : base of the RoPE frequencies (config.RALA_ROPE_BASE).
    token_scaling : "sum" (Eq. 2-3) | "mean" (official: (HW)^(-1/2) on K and V, mean in the normaliser).
    eps : 0.0 (Eq. 2) | config.RALA_OFFICIAL_EPS (official), added to the normaliser.
    gate : phi of Eq. 6: "linear" (§3.2) | "identity" | "tanh" (Table 9) | "none" ("w/o out aug").
    gate_source : "separate" (its own Linear, key "phi") | "qkvo" (official: 4th C-block of the fused
        projection "qkvo"; requires gate="linear").
    lepe_kernel : 0 (none) | 5 (official LePE on V, added before the gate).
    out_proj : False (Eq. 6 is the output) | True (official: 1 x 1 projection "proj" after the gate).
    layout : "tokens" ((B, H, W, C), Linear weights (out, in)) | "channels_first" (official: (B, C, H, W),
        1 x 1 conv weights (out, in, 1, 1)).
    qkv_bias : whether the fused projection (and phi) has a bias (True in both presets).
    order : "linear" (kappa(Q) (sum_j ...), O(N d^2)) | "quadratic" ((kappa(Q) kappa(K)^T) V, O(N^2 d)).
    """

    dim: int
    num_heads: int
    kernel: str = "elu1"
    reweight: bool = True
    global_query: str = "q"
    alpha_scale: str = "none"
    rope: bool = False
    rope_base: float = config.RALA_ROPE_BASE
    token_scaling: str = "sum"
    eps: float = 0.0
    gate: str = "linear"
    gate_source: str = "separate"
    lepe_kernel: int = 0
    out_proj: bool = False
    layout: str = "tokens"
    qkv_bias: bool = True
    order: str = "linear"

    def __post_init__(self) -> None:
        """Raises ArgumentError / ArgumentTypeError for dim, num_heads not integers >= 1 with C % h == 0, an option
        outside its choices, gate_source "qkvo" with a gate other than "linear", rope with d % 4 != 0, a lepe_kernel
        that is neither 0 nor odd, an eps that is not finite and >= 0 and a rope_base <= 0."""
        numerics.check_positive_int(self.dim, "dim")
        numerics.check_positive_int(self.num_heads, "num_heads")
        if self.dim % self.num_heads:
            raise ArgumentError(f"RALAConfig: dim={self.dim} is not divisible by num_heads={self.num_heads}")
        _choice(self.kernel, "kernel", _KERNELS)
        _choice(self.global_query, "global_query", _GLOBAL_QUERIES)
        _choice(self.alpha_scale, "alpha_scale", _ALPHA_SCALES)
        _choice(self.token_scaling, "token_scaling", _TOKEN_SCALINGS)
        _choice(self.gate, "gate", _GATES)
        _choice(self.gate_source, "gate_source", _GATE_SOURCES)
        _choice(self.layout, "layout", _LAYOUTS)
        _choice(self.order, "order", _ORDERS)
        if self.gate_source == "qkvo" and self.gate != "linear":
            raise ArgumentError(f"RALAConfig: gate_source='qkvo' makes phi a linear projection; got gate={self.gate!r}")
        if self.rope and self.head_dim % 4:
            raise ArgumentError(f"RALAConfig: rope=True needs head_dim % 4 == 0 (row and column halves of "
                             f"channel pairs), got head_dim={self.head_dim}")
        validation.check_kernel(self.lepe_kernel, "RALAConfig.lepe_kernel", allow_zero=True)
        validation.check_eps(self.eps, "RALAConfig.eps")
        validation.check_positive(self.rope_base, "RALAConfig.rope_base")

    @property
    def head_dim(self) -> int:
        """d = C / h, the head dimension."""
        return self.dim // self.num_heads

    @classmethod
    def preset(cls, name: str = "paper", **overrides: Any) -> "RALAConfig":
        """``"paper"`` (the equations) or ``"official"`` (the released code); ``dim`` and ``num_heads`` are
        required overrides, any other field may be overridden too."""
        if name == "paper":
            base: dict[str, Any] = {}
        elif name == "official":
            base = dict(global_query="kappa_q", alpha_scale="head_dim", rope=True, token_scaling="mean",
                        eps=config.RALA_OFFICIAL_EPS, gate="linear", gate_source="qkvo",
                        lepe_kernel=config.RALA_OFFICIAL_LEPE_KERNEL, out_proj=True, layout="channels_first")
        else:
            raise ArgumentError(f"RALAConfig.preset: expected 'paper' or 'official', got {name!r}")
        base.update(overrides)
        return cls(**base)


# ===================================================================================================
# Helpers: kernel, RoPE, layout
# ===================================================================================================

def kappa(x: Any, kernel: str = "elu1") -> np.ndarray:
    """The kernel feature map kappa of Eq. 2.

    x : float array, any shape.  kernel : "elu1" (ELU(x) + 1 = x + 1 for x > 0, exp(x) otherwise, §3.2;
    evaluated in that form, which keeps relative accuracy as x -> -inf) or "relu" (Table 9).
    Returns an array of x's shape, non-negative.

    References: RALA §3.2 and Table 9; Katharopoulos et al. (2020) Eq. 7.
    """
    _choice(kernel, "kernel", _KERNELS)
    return feature_map(numerics.as_float(x, "x"), kernel)


def _kappa_of(x: np.ndarray, kernel: str, dispatch: bool) -> np.ndarray:
    """:func:`kappa` inside :func:`rala_core`; with ``dispatch`` (no taps) ELU + 1 is operation
    "elu1_feature_map" of the selected backend: the definition on the NumPy backend, bit for bit, and on the C
    backend the fused kernel's own map (exp within config.ELEMENTARY_FUNCTION_ULPS, which rala_core_bound
    assumes for kappa: a relative error c u per feature, x + 1 rounded once as here)."""
    if dispatch and kernel == "elu1":
        return backends.call("elu1_feature_map", x)
    return kappa(x, kernel)


def rope_2d_angles(h: int, w: int, head_dim: int, base: float = config.RALA_ROPE_BASE) -> np.ndarray:
    """Rotation angle of every (token, channel) of the released code's 2-D RoPE.

    Channel pairs (2p, 2p+1), p = 0 .. d/2 - 1, share one angle.  With n = d/4 frequencies
    omega_q = base^(-q/(n-1)) (omega_0 = 1 when n = 1): pair p < n rotates by row(i) * omega_p and pair
    p >= n by col(i) * omega_(p-n), row(i) = i // W, col(i) = i % W.

    Returns float64 (N, d) with N = h w.  Raises ValueError unless d % 4 == 0.

    References: RALA released code (preset "official"); Su et al., RoFormer (2021), Eq. 34 (the 1-D form).
    """
    h = numerics.check_positive_int(h, "h")
    w = numerics.check_positive_int(w, "w")
    head_dim = numerics.check_positive_int(head_dim, "head_dim")
    validation.check_positive(base, "base")
    if head_dim % 4:
        raise ArgumentError(f"argument 'head_dim': 2-D RoPE needs a multiple of 4, got {head_dim}")
    n = head_dim // 4
    t = np.arange(n, dtype=np.float64) / (n - 1) if n > 1 else np.zeros(1)
    omega = float(base) ** (-t)                                           # (n,)
    rows = np.repeat(np.arange(h, dtype=np.float64), w)                   # (N,) row of token i
    cols = np.tile(np.arange(w, dtype=np.float64), h)                     # (N,) column of token i
    pair_angle = np.concatenate([rows[:, None] * omega, cols[:, None] * omega], axis=1)   # (N, d/2)
    return np.repeat(pair_angle, 2, axis=1)                               # (N, d)


def apply_rope_2d(x: Any, angles: Any) -> np.ndarray:
    """Rotate interleaved channel pairs: (x_2p, x_2p+1) -> (x_2p cos - x_2p+1 sin, x_2p+1 cos + x_2p sin).

    x : (..., N, d) float; angles : (N, d) float from :func:`rope_2d_angles` (both channels of a pair carry
    the same angle).  Returns an array of x's shape.

    References: RoFormer Eq. 34; RALA released code (preset "official").
    """
    x = numerics.as_float(x, "x")
    angles = numerics.as_float(angles, "angles")
    if x.ndim < 2 or x.shape[-2:] != angles.shape or angles.shape[-1] % 2:
        raise ArgumentError(f"argument 'angles': expected shape (N, d) = {x.shape[-2:]} with d even, "
                         f"got {angles.shape}")
    c, s = np.cos(angles), np.sin(angles)
    xe, xo = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = xe * c[:, 0::2] - xo * s[:, 0::2]
    out[..., 1::2] = xo * c[:, 1::2] + xe * s[:, 1::2]
    return out


def _grid_to_tokens(x: np.ndarray, layout: str) -> tuple[np.ndarray, int, int]:
    """(B, H, W, C) or (B, C, H, W) -> (B, N, C) tokens, H, W."""
    if layout == "tokens":
        b, h, w, c = x.shape
        return x.reshape(b, h * w, c), h, w
    b, c, h, w = x.shape
    return x.reshape(b, c, h * w).transpose(0, 2, 1), h, w


def _tokens_to_grid(t: np.ndarray, h: int, w: int, layout: str) -> np.ndarray:
    b, n, c = t.shape
    if layout == "tokens":
        return t.reshape(b, h, w, c)
    return t.transpose(0, 2, 1).reshape(b, c, h, w)


def _tokens_to_cf(t: np.ndarray, h: int, w: int) -> np.ndarray:
    return _tokens_to_grid(t, h, w, "channels_first")


def _split_heads(t: np.ndarray, heads: int) -> np.ndarray:
    """(B, N, C) -> (B, h, N, d), channel h*d + e -> head h, channel e."""
    b, n, c = t.shape
    return t.reshape(b, n, heads, c // heads).transpose(0, 2, 1, 3)


def _merge_heads(y: np.ndarray) -> np.ndarray:
    b, h, n, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def _weight2d(w: np.ndarray, layout: str, key: str, out: int, inp: int) -> np.ndarray:
    """A projection weight as (out, in): Linear (out, in) in the tokens layout, 1 x 1 conv (out, in, 1, 1)
    channels-first (a 1 x 1 convolution is the same linear map applied at every pixel)."""
    w = numerics.as_float(w, key)
    want = (out, inp) if layout == "tokens" else (out, inp, 1, 1)
    if w.shape != want:
        raise ArgumentError(f"parameter '{key}': expected shape {want} for layout={layout!r}, got {w.shape}")
    return w.reshape(out, inp)


def _param(params: Mapping[str, Any], key: str) -> np.ndarray:
    if key not in params:
        raise ParameterKeyError(f"RALA: missing parameter '{key}'")
    return numerics.as_float(params[key], key)


# ===================================================================================================
# The attention core (per head, after the projections)
# ===================================================================================================

def reweighting_coefficients(q_global: Any, kappa_k: Any, scale: float = 1.0) -> np.ndarray:
    """alpha_j = N softmax_j(scale * Q_g kappa(K_j)^T)  (Eq. 4; scale = 1 in the paper).

    q_global : (B, h, 1, d); kappa_k : (B, h, N, d).  Returns (B, h, N), positive, summing to N over j
    (to rounding).  Softmax by max-subtraction (numerics.softmax), so no logit overflows.  Range safety:
    q_global and kappa_k are rescaled per head by exact powers of two (numerics.pow2_exponent; none inside
    its band, where this is the unscaled computation bit for bit) and the logits' differences scaled back
    (numerics.softmax_shifted), so logits beyond the float64 range (1e150-sized inputs) give the saturated
    softmax they have, not NaN.

    References: RALA Eq. 3-4.
    """
    validation.check_real(scale, "scale")
    q_global = numerics.as_float(q_global, "q_global")
    kappa_k = numerics.as_float(kappa_k, "kappa_k")
    sz = numerics.check_shapes(q_global=(q_global, "B h 1 d"), kappa_k=(kappa_k, "B h N d"))
    e_g = numerics.pow2_exponent(q_global, axis=(-2, -1))[..., 0]       # (B,h,1)
    e_k = numerics.pow2_exponent(kappa_k, axis=(-2, -1))[..., 0]        # (B,h,1)
    scores = scale * (np.ldexp(q_global, -e_g[..., None]) @ np.ldexp(kappa_k, -e_k[..., None]).swapaxes(-1, -2))[..., 0, :]
    return sz["N"] * numerics.softmax_shifted(scores, e_g + e_k, axis=-1)


def kv_buffer(alpha: Any, kappa_k: Any, v: Any) -> np.ndarray:
    """The reweighted KV buffer B = sum_j alpha_j kappa(K_j)^T V_j  (Eq. 3).

    alpha : (B, h, N); kappa_k : (B, h, N, d); v : (B, h, N, e).  Returns (B, h, d, e).

    References: RALA Eq. 3 (alpha = 1 gives Eq. 2's buffer).
    """
    alpha = numerics.as_float(alpha, "alpha")
    kappa_k = numerics.as_float(kappa_k, "kappa_k")
    v = numerics.as_float(v, "v")
    numerics.check_shapes(alpha=(alpha, "B h N"), kappa_k=(kappa_k, "B h N d"), v=(v, "B h N e"))
    return np.einsum("bhn,bhnd,bhne->bhde", alpha, kappa_k, v, optimize=True)


def _quadratic_guard(bsz: int, heads: int, n: int, max_elements: int | None) -> None:
    limit = config.QUADRATIC_MAX_ELEMENTS if max_elements is None else max_elements
    if bsz * heads * n * n > limit:
        raise ArgumentError(
            f"rala_core(order='quadratic'): the N x N matrix would have B*h*N*N = {bsz * heads * n * n} "
            f"elements, above max_elements = {limit} (config.QUADRATIC_MAX_ELEMENTS); use order='linear' "
            f"(RALAConfig(order='linear')), which computes the same attention in O(N d^2)")


def rala_core(q: Any, k: Any, v: Any, cfg: RALAConfig, hw: tuple[int, int] | None = None, *,
              taps: dict | None = None, max_elements: int | None = None) -> np.ndarray:
    """Reweighted linear attention per head: kappa(Q_i) B / (kappa(Q_i) sum_j alpha_j kappa(K_j)^T).

    Parameters
    ----------
    q, k, v : (B, h, N, d) float (the projections, before kappa).
    cfg : :class:`RALAConfig` (kernel, reweight, global_query, alpha_scale, rope, token_scaling, eps,
        order are used).
    hw : (H, W) with H W = N, required when cfg.rope.
    taps : optional dict; receives "kappa_q", "kappa_k" (B,h,N,d), "q_global" (B,h,1,d), "scores",
        "alpha" (B,h,N), "k_weighted" = alpha_j kappa(K_j) (B,h,N,d), with rope "q_rot", "k_rot",
        "kv" (B,h,d,d; linear order) or "attn" (B,h,N,N numerator weights; quadratic order), "numerator"
        (B,h,N,d), "key_sum" (B,h,d), "denominator" (B,h,N), "out".
    max_elements : cap on B h N^2 for the quadratic order (default config.QUADRATIC_MAX_ELEMENTS).

    Returns
    -------
    (B, h, N, d) float64.  A zero normaliser (relu kernel with a dead query row; eps = 0) gives 0/0 = NaN,
    as IEEE arithmetic says.

    References
    ----------
    RALA Eq. 2 (normaliser), Eq. 3 (B), Eq. 4 (Q_g, alpha), Eq. 6 (before the gate); options: released code.
    """
    validation.check_max_elements(max_elements)
    validation.check_config(cfg, RALAConfig)
    validation.check_taps(taps)
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h N d"), v=(v, "B h N d"))
    n, d = sz["N"], sz["d"]
    if hw is not None:
        hw = validation.check_grid(hw, n, tokens="q")
    t = taps if taps is not None else {}
    if taps is None and cfg.order == "linear" and not cfg.rope:
        # The configuration the fused kernels implement goes through the backend switch; None where no kernel
        # takes the call (the default NumPy backend; dtypes the kernels' predicates refuse): the path below.
        fused = _rala_core_fused(q, k, v, cfg)
        if fused is not None:
            return fused

    kq = _kappa_of(q, cfg.kernel, taps is None)
    kk = _kappa_of(k, cfg.kernel, taps is None)
    t["kappa_q"], t["kappa_k"] = kq, kk

    # Eq. 4: the global query and the reweighting coefficients.
    if cfg.reweight:
        q_g, scale, alpha = _reweighting(q, kq, kk, cfg)
        if taps is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                t["q_global"], t["scores"] = q_g, scale * (q_g @ kk.swapaxes(-1, -2))[..., 0, :]
    else:
        alpha = np.ones(q.shape[:-1], dtype=q.dtype)
    t["alpha"] = alpha

    # Range safety (docs/guarantees.md): Eq. 2 is homogeneous of degree 0 in each row of kappa(Q)
    # and in each head's kappa(K) and of degree 1 in each column of V: each is rescaled by an exact power of
    # two (normaliser_range.scaling_exponents: above 2^B down, below 2^-B up; none inside the band: then this is
    # the unscaled computation bit for bit), eps with the normaliser (normaliser_range.normaliser_scaled, exact),
    # the taps are scaled back; an output beyond float64 raises FloatingPointError naming the stage, and a row
    # whose normaliser underflowed to 0 although the exact one is > 0 is recomputed from log-features (_finish;
    # the rows: recomputed_rows).
    e_q, e_k, e_v = scaling_exponents(kq, kk, v)        # (B,h,N,1), (B,h,1,1), (B,h,1,e)
    kq_s, v_s = np.ldexp(kq, -e_q), np.ldexp(v, -e_v)
    kw = alpha[..., None] * np.ldexp(kk, -e_k)          # alpha_j kappa(K_j), scaled by 2^-e_k

    # Numerator operands: rotated (official) or not.
    if cfg.rope:
        if hw is None or hw[0] * hw[1] != n:
            raise ArgumentError(f"argument 'hw': rope needs the grid (H, W) with H*W = N = {n}, got {hw}")
        ang = rope_2d_angles(hw[0], hw[1], d, cfg.rope_base)
        qn, kn = apply_rope_2d(kq_s, ang), apply_rope_2d(kw, ang)
    else:
        qn, kn = kq_s, kw
    # (HW)^(-1/2) on K and V (official) = 1/N on the numerator; the normaliser then uses the mean.
    norm = 1.0 / n if cfg.token_scaling == "mean" else 1.0

    if cfg.order == "linear":
        kv = norm * (kn.swapaxes(-1, -2) @ v_s)         # Eq. 3: B, (B, h, d, d)
        num = qn @ kv
    else:
        _quadratic_guard(sz["B"], sz["h"], n, max_elements)
        a = norm * (qn @ kn.swapaxes(-1, -2))           # (B, h, N, N)
        num = a @ v_s
    key_sum = norm * np.sum(kw, axis=-2)                # sum_j (or mean_j) alpha_j kappa(K_j), unrotated
    den = np.einsum("bhnd,bhd->bhn", kq_s, key_sum)     # Eq. 2's normaliser
    e_qk = (e_q + e_k)[..., 0]                          # (B,h,N): the normaliser's exponent
    den, g = normaliser_scaled(den, e_qk, eps=cfg.eps, eps_policy="add", clamp_min=None)
    rot = None if not cfg.rope else (lambda x: apply_rope_2d(x, ang),) * 2
    out = _finish(num, den, g, e_v, q, k, v_s, alpha, kq_s, key_sum, cfg.kernel, norm, cfg.eps, rot,
                  rope_shared_pairs(ang) if cfg.rope else False, kq, kk)
    e_qk = e_qk + g                                     # the tapped normaliser's exponent
    if taps is not None:
        with np.errstate(over="ignore"):
            t["k_weighted"] = np.ldexp(kw, e_k)
            if cfg.rope:
                t["q_rot"], t["k_rot"] = np.ldexp(qn, e_q), np.ldexp(kn, e_k)
            if cfg.order == "linear":
                t["kv"] = np.ldexp(kv, e_k + e_v)
            else:
                t["attn"] = np.ldexp(a, e_q + e_k)
            t["numerator"] = np.ldexp(num, e_q + e_k + e_v)
            t["key_sum"], t["denominator"] = np.ldexp(key_sum, e_k[..., 0]), np.ldexp(den, e_qk)
        t["out"] = out
    return out


def _finish(num: np.ndarray, den: np.ndarray, g: np.ndarray, e_v: np.ndarray, q: np.ndarray, k: np.ndarray,
            v_s: np.ndarray, alpha: np.ndarray, kq_s: np.ndarray, key_sum: np.ndarray, kernel: str, norm: float,
            eps: float, rotate: Any, pairs: Any = False, kq: np.ndarray | None = None,
            kk: np.ndarray | None = None) -> np.ndarray:
    """The core's output (num / den) 2^(e_v - g) (normaliser_range.quotient: FloatingPointError naming the
    stage beyond float64), with the rows whose normaliser underflowed to 0 although the exact one is > 0
    (:func:`_hit_rows`) recomputed from log-features (normaliser_range.rebalanced_output: log kappa(Q),
    log alpha_j + log kappa(K_j) + log s; with RoPE the channel pairs marked in ``pairs``, those whose angle
    differs between tokens, share one factor, :func:`rope_shared_pairs`); the direct quotient of those rows is
    not formed (a subnormal normaliser could make it overflow where the exact result is finite).
    FloatingPointError naming the normaliser where even the recomputation has none: alpha_j underflowed to 0
    for every key that matters, or (RoPE) a shared pair's channels differ beyond float64's range, so that its
    rotated cross terms exceed the normaliser by as much and the exact result is beyond float64 unless the
    rotation cancels them."""
    stage = "rala_core: output kappa(Q_i) B / normaliser"
    hit = _hit_rows(den, q, k, alpha, kq_s, key_sum, kernel, kq, kk)
    out = quotient(np.where(hit[..., None], 0.0, num), np.where(hit, 1.0, den)[..., None], e_v - g[..., None], stage)
    if np.any(hit):
        with np.errstate(divide="ignore", invalid="ignore"):
            lq = log_features(q, kernel, {})
            lk = log_features(k, kernel, {}) + (np.log(alpha)[..., None] + np.log(norm))
        fix = rebalanced_output(lq, lk, v_s, e_v, eps=eps, eps_policy="add", clamp_min=None, stage=stage,
                                pairs=pairs if rotate is not None else False, rotate=rotate)
        out = np.where(hit[..., None], fix, out)
        left = hit & ~np.all(np.isfinite(fix), axis=-1)
        finite_in = np.all(np.isfinite(q)) and np.all(np.isfinite(k)) and np.all(np.isfinite(v_s))
        if finite_in and np.any(left):      # (non-finite inputs propagate, as the layer's checks expect)
            with np.errstate(invalid="ignore"):
                keyed = np.isfinite(np.max(lq + np.max(lk, axis=-2, keepdims=True), axis=-1))
            paired = left & keyed if rotate is not None else np.zeros_like(left)
            if np.any(paired):
                idx = tuple(int(i) for i in np.argwhere(paired)[0])
                raise FloatingPointError(
                    f"{stage}: at index {idx} a RoPE channel pair rotated by angles that differ between tokens has "
                    f"key features whose two channels differ beyond the float64 range; its rotated cross terms "
                    f"exceed the normaliser by as much, so the exact result is beyond float64 (unless the rotation "
                    f"cancels them exactly); it is not representable here")
            raise underflow_error(left, "rala_core: normaliser kappa(Q_i) . sum_j alpha_j kappa(K_j)")
    return out


def rope_shared_pairs(angles: np.ndarray) -> np.ndarray:
    """The RoPE channel pairs (d / 2,) whose angle is nonzero for some token (``angles`` (N, d) from
    :func:`rope_2d_angles`): their rotation mixes the pair's channels, which must then share one rebalancing
    factor.  A pair at angle 0 for every token (the row pairs of a one-row grid, the column pairs of a
    one-column grid) is not rotated at all (cos 0 = 1 and sin 0 = 0 exactly) and may keep one per channel."""
    return np.any(angles[:, 0::2] != 0, axis=0)


def _hit_rows(den: np.ndarray, q: np.ndarray, k: np.ndarray, alpha: np.ndarray, kq_s: np.ndarray,
              key_sum: np.ndarray, kernel: str, kq: np.ndarray | None = None,
              kk: np.ndarray | None = None) -> np.ndarray:
    """The rows (B, h, N) :func:`_finish` recomputes from log-features (normaliser_range.underflow_rows on the
    rescaled normaliser ``den``).  relu: whether a term kappa(Q_i)_c kappa(K_j)_c alpha_j is > 0 in exact
    arithmetic does not depend on alpha (> 0, though it may underflow to 0 when Eq. 4's softmax saturates):
    the unweighted key sum is tested.  ``kq``, ``kk``: kappa(q), kappa(k) where the caller has them."""
    kq = kappa(q, kernel) if kq is None else kq
    kk = kappa(k, kernel) if kk is None else kk
    return underflow_rows(den, kq_s, np.sum(kk, axis=-2) if kernel == "relu" else key_sum, kernel == "elu1",
                          (kq, alpha[..., None] * kk))


def recomputed_rows(q: np.ndarray, k: np.ndarray, cfg: RALAConfig) -> tuple[np.ndarray, np.ndarray]:
    """(hit, alpha): the rows (B, h, N) whose normaliser :func:`rala_core` (float64 q, k, v given) finds
    underflowed and recomputes from log-features, and Eq. 4's alpha (B, h, N) it uses there (ones without
    reweighting): the same normaliser, rescaled as in :func:`rala_core` (it does not depend on V or on RoPE,
    which rotates only the numerator's operands).  For rala_bounds.rala_core_bound."""
    kq, kk = kappa(q, cfg.kernel), kappa(k, cfg.kernel)
    alpha = _reweighting(q, kq, kk, cfg)[2] if cfg.reweight else np.ones(q.shape[:-1], dtype=q.dtype)
    e_q, e_k, _ = scaling_exponents(kq, kk, kq[..., :1, :])
    kq_s, kw = np.ldexp(kq, -e_q), alpha[..., None] * np.ldexp(kk, -e_k)
    key_sum = (1.0 / q.shape[-2] if cfg.token_scaling == "mean" else 1.0) * np.sum(kw, axis=-2)
    den = np.einsum("bhnd,bhd->bhn", kq_s, key_sum)
    den = normaliser_scaled(den, (e_q + e_k)[..., 0], eps=cfg.eps, eps_policy="add", clamp_min=None)[0]
    return _hit_rows(den, q, k, alpha, kq_s, key_sum, cfg.kernel, kq, kk), alpha


def _reweighting(q: np.ndarray, kq: np.ndarray | None, kk: np.ndarray, cfg: RALAConfig):
    """(Q_g, scale, alpha) of Eq. 4: Q_g the mean of Q (global_query "q") or of kappa(Q) = ``kq`` over the
    tokens, scale = d^(-1/2) (alpha_scale "head_dim") or 1, alpha = N softmax_j(scale Q_g kappa(K_j)^T)."""
    q_g = _token_mean(q if cfg.global_query == "q" else kq)
    scale = q.shape[-1] ** -0.5 if cfg.alpha_scale == "head_dim" else 1.0
    return q_g, scale, reweighting_coefficients(q_g, kk, scale)


def _token_mean(x: np.ndarray) -> np.ndarray:
    """mean_i x_i over the tokens (axis -2, kept), on x 2^-e per head (numerics.pow2_exponent: e = 0, the
    plain np.mean bit for bit, inside its band) scaled back, so that a sum of 1e300-sized rows cannot
    overflow: the global query Q_g of Eq. 4."""
    e = numerics.pow2_exponent(x, axis=(-2, -1))
    return np.ldexp(np.mean(np.ldexp(x, -e), axis=-2, keepdims=True), e)


def _rala_core_fused(q: np.ndarray, k: np.ndarray, v: np.ndarray, cfg: RALAConfig) -> np.ndarray | None:
    """:func:`rala_core` for linear order without RoPE or taps, on the selected backend: operation
    "rala_alpha" (Eq. 4, O(N d)), then operation "reweighted_linear_attention" (Eq. 2-3); both take the raw
    q, k and apply kappa themselves.  None where ``backends.call`` runs no kernel (the NumPy backend, or a
    call the kernels' predicates refuse): :func:`rala_core` then computes its NumPy path.

    On the C backend alpha comes from its own multi-threaded kernel (ckernels/rala_body.h): the same
    operations as :func:`_rala_alpha_numpy` in a fixed order of its own, with the kernel's exp (within
    config.ELEMENTARY_FUNCTION_ULPS, as rala_core_bound assumes), so alpha may differ from the NumPy
    path's in the last bits; the NumPy path is unchanged."""
    if cfg.reweight:
        scale = q.shape[-1] ** -0.5 if cfg.alpha_scale == "head_dim" else 1.0
        alpha = backends.call("rala_alpha", q, k, cfg.global_query, cfg.kernel, scale, otherwise=lambda: None)
        if alpha is None:
            return None
    else:
        alpha = np.ones(q.shape[:-1], dtype=q.dtype)
    kv_scale = 1.0 / q.shape[-2] if cfg.token_scaling == "mean" else 1.0
    return backends.call("reweighted_linear_attention", q, k, v, alpha, cfg.kernel, kv_scale, cfg.eps,
                         otherwise=lambda: None)


@backends.register("rala_alpha", "numpy")
def _rala_alpha_numpy(q: Any, k: Any, global_query: str = "q", kernel: str = "elu1", scale: float = 1.0, *,
                      out: np.ndarray | None = None, workspace: Any = None, threads: Any = None) -> np.ndarray:
    """The NumPy definition of operation "rala_alpha" (twin of the C kernel ``refimpl_rala_alpha``): RALA's
    reweighting coefficients with the operations of :func:`rala_core` (``_reweighting``),

    Q_g = mean_i x_i (x = Q, or kappa(Q) for global_query "kappa_q"),  alpha_j = M softmax_j(scale Q_g . kappa(K_j)).

    Parameters
    ----------
    q : (B, h, N, d) float.  k : (B, h, M, d) float (M = N in RALA).  global_query : "q" | "kappa_q".
    kernel : "elu1" | "relu" (kappa).  scale : float (d^(-1/2) for alpha_scale "head_dim", else 1).
    out : optional (B, h, M) array the result is copied into and returned.
    workspace, threads : accepted and ignored (the C kernel's buffer and thread count).

    Returns
    -------
    ndarray (B, h, M): positive, summing to M over j (to rounding).

    References
    ----------
    RALA Eq. 4.
    """
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h M d"))
    _choice(global_query, "global_query", _GLOBAL_QUERIES)
    _choice(kernel, "kernel", _KERNELS)
    q_g = _token_mean(q if global_query == "q" else kappa(q, kernel))
    res = reweighting_coefficients(q_g, kappa(k, kernel), scale)
    if out is not None:
        out[...] = res
        return out
    return res


@backends.register("reweighted_linear_attention", "numpy")
def _reweighted_linear_attention_numpy(q: Any, k: Any, v: Any, alpha: Any, kernel: str = "elu1",
                                       kv_scale: float = 1.0, eps: float = 0.0, *, out: np.ndarray | None = None,
                                       workspace: Any = None, threads: Any = None) -> np.ndarray:
    """The NumPy definition of operation "reweighted_linear_attention" (twin of the fused C kernel): the
    linear-order, RoPE-free branch of :func:`rala_core` given the coefficients alpha,

    O_i = kappa(Q_i) B / (kappa(Q_i) . s sum_j alpha_j kappa(K_j) + eps),  B = s sum_j alpha_j kappa(K_j)^T V_j

    with the same operations as :func:`rala_core` (s = ``kv_scale``: 1, or 1/N for token_scaling "mean";
    eps added only when nonzero).

    Parameters
    ----------
    q (B, h, N, d), k (B, h, M, d), v (B, h, M, e), alpha (B, h, M) : float arrays.  kernel : "elu1" | "relu".
    kv_scale, eps : floats.  out : optional (B, h, N, e) array the result is copied into and returned.
    workspace, threads : accepted and ignored (the kernels' buffers and thread count).

    Returns
    -------
    ndarray (B, h, N, e).

    References
    ----------
    RALA Eq. 2-4.
    """
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    alpha = numerics.as_float(alpha, "alpha")
    numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h M d"), v=(v, "B h M e"), alpha=(alpha, "B h M"))
    _choice(kernel, "kernel", _KERNELS)
    # Range safety as in rala_core: exact power-of-two rescaling of kappa(Q) rows, each head's kappa(K) and
    # each value column, tiny groups up (none inside the band: the unscaled computation bit for bit),
    # the same FloatingPointError where not representable, the same log-feature rows where it underflows.
    kq0, kk = kappa(q, kernel), kappa(k, kernel)
    e_q, e_k, e_v = scaling_exponents(kq0, kk, v)
    kq, v = np.ldexp(kq0, -e_q), np.ldexp(v, -e_v)
    kw = alpha[..., None] * np.ldexp(kk, -e_k)
    kv = kv_scale * (kw.swapaxes(-1, -2) @ v)
    key_sum = kv_scale * np.sum(kw, axis=-2)
    den = np.einsum("bhnd,bhd->bhn", kq, key_sum)
    den, g = normaliser_scaled(den, (e_q + e_k)[..., 0], eps=eps, eps_policy="add", clamp_min=None)
    res = _finish(kq @ kv, den, g, e_v, q, k, v, alpha, kq, key_sum, kernel, kv_scale, eps, None, kq=kq0, kk=kk)
    if out is not None:
        out[...] = res
        return out
    return res
