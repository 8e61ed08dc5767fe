"""RALA, rank-augmented linear attention, and the RAVLT block.

Reference: Q. Fan, H. Huang, R. He, "Breaking the Low-Rank Dilemma of Linear Attention", CVPR 2025
(seed 002).  Equation numbers below are the paper's.

Shapes: B batch, H x W token grid, N = H W tokens (row-major: token i sits at row i // W, column i % W),
C channels, h heads, d = C / h head dim.  Per head, q, k, v are (B, h, N, d).

The mechanism, per head (kappa the kernel feature map, ELU + 1 by default, §3.2 "Design of the block"):

    Q_g     = (1/N) sum_i Q_i                                                         (Eq. 4, first line)
    alpha_j = N exp(Q_g kappa(K_j)^T) / sum_m exp(Q_g kappa(K_m)^T)                   (Eq. 4)
    B       = sum_j alpha_j kappa(K_j)^T V_j,      sum_j alpha_j = N                  (Eq. 3)
    Y_i     = phi(X_i) (.) [kappa(Q_i) B / (kappa(Q_i) sum_j alpha_j kappa(K_j)^T)]   (Eq. 6 with Eq. 2's
                                                                                        normaliser)

phi is a linear projection (§3.2), or the identity or tanh (Table 9).  Eq. 6 as printed has no
denominator; Eq. 2 has one and §3.2 says the scalar denominator does not affect the rank, so the
reference keeps it (both the paper preset and the released code normalise).

The RAVLT block (§3.2, Fig. 6): x <- x + DWConv3x3(x) (CPE), x <- x + RALA(LN(x)), x <- x + FFN(LN(x)).
The paper's text gives "CPE, attention, FFN" and "the classic Transformer block"; Fig. 6 is not in the
text, so the norm placement (pre-norm, LayerNorm over channels) is taken from the released code and is
the same in both presets.

Presets (:meth:`RALAConfig.preset`, :meth:`RAVLTBlockConfig.preset`): ``"paper"`` computes the equations
above; ``"official"`` computes what the authors' released code computes, every departure a named option:

- ``alpha_scale="head_dim"``: the alpha softmax logits are multiplied by d^(-1/2);
- ``global_query="kappa_q"``: Q_g is the mean of kappa(Q), not of Q;
- ``rope=True``: a 2-D rotary position encoding of kappa(Q_i) and alpha_j kappa(K_j) in the *numerator*
  only, on interleaved channel pairs (2p, 2p+1); pairs p < d/4 rotate by (row of the token) * omega_p,
  pairs p >= d/4 by (column) * omega_(p - d/4), omega_p = base^(-p/(d/4 - 1)).  The normaliser uses the
  unrotated vectors;
- ``token_scaling="mean"``: K and V are each scaled by (HW)^(-1/2) in the KV product and the normaliser
  uses mean_j alpha_j kappa(K_j), so numerator and denominator carry the same 1/N (a no-op in exact
  arithmetic, which matters only together with ``eps``);
- ``eps=1e-6`` added to that normaliser;
- ``lepe_kernel=5``: a 5 x 5 depthwise conv of V (LePE) added to the attention output before the gate;
- ``gate_source="qkvo"``: the gate phi(X) is the fourth C-channel block of the same 1 x 1 conv that makes
  Q, K and V (a linear projection, no activation), and ``out_proj=True``: a 1 x 1 output projection after
  the gate;
- ``layout="channels_first"``: (B, C, H, W) tensors and 1 x 1 conv weights (C_out, C_in, 1, 1);
- block: ``ffn_dwconv=True`` (the FFN is fc1 -> GELU -> h + DWConv3x3(h) -> fc2), ``norm_eps=1e-6``,
  ``mlp_ratio=3``.

Numerics: kappa(x) = ELU(x) + 1 is evaluated as x + 1 (x > 0) and exp(x) (x <= 0), the same real
function; computing it literally as (exp(x) - 1) + 1, as ``F.elu(x) + 1`` does, loses all relative
accuracy for x << 0 (see docs/rala.md).  The error bounds (:func:`rala_core_bound`,
:func:`rala_attention_bound`, :func:`ravlt_ffn_bound`) propagate a rigorous running bound on the absolute
error, stage by stage, for a computation in the tested precision T; see "Error model" at the bottom.

Contents, top to bottom: configurations and presets; helpers (kernel, RoPE, layout); the attention core;
the attention layer; the RAVLT block; parameter shapes; the error model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from .. import backends, config, layers, numerics, validation, verdict
from ..errors import ArgumentError, ArgumentTypeError, ParameterKeyError
from .focused import _token_quadrature
from .linear import feature_map

__all__ = [
    "RALAConfig", "RAVLTBlockConfig", "kappa", "rope_2d_angles", "apply_rope_2d", "reweighting_coefficients",
    "kv_buffer", "rala_core", "rala_attention", "ravlt_ffn", "ravlt_block", "rala_param_shapes",
    "ravlt_block_param_shapes", "rala_core_bound", "rala_attention_bound", "ravlt_ffn_bound",
    "residual_bound", "ravlt_cpe",
]

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


@dataclasses.dataclass(frozen=True)
class RAVLTBlockConfig:
    """Options of the RAVLT block: CPE, pre-norm RALA, pre-norm FFN, each with a residual (§3.2, Fig. 6).

    attn : the :class:`RALAConfig` (its ``layout`` is the block's layout).
    mlp_ratio : FFN hidden width / C (config.RALA_PAPER_MLP_RATIO; official RALA_OFFICIAL_MLP_RATIO).
    norm_eps : LayerNorm eps (config.LAYER_NORM_EPS; official RALA_OFFICIAL_NORM_EPS).
    cpe_kernel : CPE depthwise kernel (3, §3.2), 0 = no CPE ("w/o CPE", Table 9).
    ffn_dwconv : False (fc1 -> GELU -> fc2) | True (official: a 3 x 3 depthwise conv with residual after
        the GELU).
    layerscale : False | True (official: every registered RAVLT model scales both branches by learned
        per-channel factors "gamma_1", "gamma_2" before the residual additions).
    """

    attn: RALAConfig
    mlp_ratio: float = config.RALA_PAPER_MLP_RATIO
    norm_eps: float = config.LAYER_NORM_EPS
    cpe_kernel: int = config.RALA_CPE_KERNEL
    ffn_dwconv: bool = False
    layerscale: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.attn, RALAConfig):
            raise ArgumentTypeError(f"RAVLTBlockConfig.attn: expected a RALAConfig, got {type(self.attn).__name__}")
        validation.check_positive(self.mlp_ratio, "RAVLTBlockConfig.mlp_ratio")
        if self.hidden < 1:
            raise ArgumentError(f"RAVLTBlockConfig.mlp_ratio: hidden width int(mlp_ratio * dim) must be >= 1, "
                                f"got {self.mlp_ratio} * {self.attn.dim}")
        validation.check_kernel(self.cpe_kernel, "RAVLTBlockConfig.cpe_kernel", allow_zero=True)
        validation.check_eps(self.norm_eps, "RAVLTBlockConfig.norm_eps")

    @property
    def hidden(self) -> int:
        return int(self.mlp_ratio * self.attn.dim)

    @classmethod
    def preset(cls, name: str = "paper", **overrides: Any) -> "RAVLTBlockConfig":
        """``"paper"`` or ``"official"``.  Overrides naming RALAConfig fields (dim, num_heads, order, ...)
        go to the attention config; the others to the block."""
        block_fields = {f.name for f in dataclasses.fields(cls)} - {"attn"}
        attn_over = {k: v for k, v in overrides.items() if k not in block_fields}
        block_over = {k: v for k, v in overrides.items() if k in block_fields}
        attn = RALAConfig.preset(name, **attn_over)
        base: dict[str, Any] = {}
        if name == "official":
            base = dict(mlp_ratio=config.RALA_OFFICIAL_MLP_RATIO, norm_eps=config.RALA_OFFICIAL_NORM_EPS,
                        ffn_dwconv=True, layerscale=True)
        base.update(block_over)
        return cls(attn=attn, **base)


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


def _check_params(params: Any, expected: Mapping[str, tuple[int, ...]], where: str) -> None:
    """The strict parameter check (:func:`refimpl.validation.check_params`): expected keys from
    :func:`rala_param_shapes` (the layer) or :func:`ravlt_block_param_shapes` (the block, its FFN)."""
    validation.check_params(params, expected, where=where)


def _ffn_shapes(cfg: RAVLTBlockConfig) -> dict[str, tuple[int, ...]]:
    return {k[len("ffn."):]: s for k, s in ravlt_block_param_shapes(cfg).items() if k.startswith("ffn.")}


def _check_grid(x: Any, layout: str, dim: int, name: str = "x") -> np.ndarray:
    x = numerics.as_float(x, name)
    spec = "B H W C" if layout == "tokens" else "B C H W"
    numerics.check_shapes({"C": dim}, **{name: (x, spec)})
    return x


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

    kq = kappa(q, cfg.kernel)
    kk = kappa(k, cfg.kernel)
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

    # Range safety: Eq. 2 is homogeneous of degree 0 in each row of kappa(Q) and in each head's kappa(K)
    # and of degree 1 in each column of V: each is rescaled by the exact power of two of
    # numerics.pow2_exponent (none inside its band: then this is the unscaled computation bit for bit),
    # eps with the normaliser, and the taps are scaled back.
    e_q = numerics.pow2_exponent(kq, axis=-1)           # (B,h,N,1)
    e_k = numerics.pow2_exponent(kk, axis=(-2, -1))     # (B,h,1,1)
    e_v = numerics.pow2_exponent(v, axis=-2)            # (B,h,1,e)
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
    if cfg.eps:
        with np.errstate(over="ignore"):
            den = den + (np.ldexp(den.dtype.type(cfg.eps), -e_qk) if np.any(e_qk) else cfg.eps)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        out = np.ldexp(num / den[..., None], e_v)
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
    kq, kk = kappa(q, kernel), kappa(k, kernel)
    # Range safety as in rala_core: exact power-of-two rescaling of kappa(Q) rows, each head's kappa(K) and
    # each value column (none inside numerics.pow2_exponent's band: the unscaled computation bit for bit).
    e_q, e_k, e_v = (numerics.pow2_exponent(kq, axis=-1), numerics.pow2_exponent(kk, axis=(-2, -1)),
                     numerics.pow2_exponent(v, axis=-2))
    kq, v = np.ldexp(kq, -e_q), np.ldexp(v, -e_v)
    kw = alpha[..., None] * np.ldexp(kk, -e_k)
    kv = kv_scale * (kw.swapaxes(-1, -2) @ v)
    key_sum = kv_scale * np.sum(kw, axis=-2)
    den = np.einsum("bhnd,bhd->bhn", kq, key_sum)
    if eps:
        e_qk = (e_q + e_k)[..., 0]
        with np.errstate(over="ignore"):
            den = den + (np.ldexp(den.dtype.type(eps), -e_qk) if np.any(e_qk) else eps)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        res = np.ldexp((kq @ kv) / den[..., None], e_v)
    if out is not None:
        out[...] = res
        return out
    return res


# ===================================================================================================
# The attention layer
# ===================================================================================================

def rala_attention(x: Any, params: Mapping[str, Any], cfg: RALAConfig, *, taps: dict | None = None,
                   max_elements: int | None = None) -> np.ndarray:
    """The RALA layer: projections, the reweighted core, (LePE), the gate phi(X) of Eq. 6, (projection).

    Parameters
    ----------
    x : (B, H, W, C) (layout "tokens") or (B, C, H, W) (layout "channels_first") float.
    params : flat mapping keyed like the PyTorch twin's state_dict (see :func:`rala_param_shapes`):
        "qkv.weight"/"qkv.bias" (3C rows: Q, K, V blocks, each head-major) and, for gate "linear",
        "phi.weight"/"phi.bias"; or (gate_source "qkvo") "qkvo.weight"/"qkvo.bias" (4C rows: Q, K, V, gate);
        "lepe.weight" (C, 1, k, k)/"lepe.bias" when lepe_kernel; "proj.weight"/"proj.bias" when out_proj.
    cfg : :class:`RALAConfig`.
    taps : optional dict; receives "q", "k", "v" (B,h,N,d), "gate" (B,N,C), "core" (B,N,C, merged heads),
        "lepe" (B,N,C), "pre_gate", "gated", "out" (layout of x) and the core's taps prefixed "core.".
    max_elements : as :func:`rala_core`.

    Returns
    -------
    Array of x's shape and layout.

    References
    ----------
    RALA Eq. 2-4, 6, §3.2 (phi a linear projection), Table 9 (identity, tanh, "w/o out aug"); released
    code for the official options.
    """
    validation.check_max_elements(max_elements)
    validation.check_config(cfg, RALAConfig)
    x = _check_grid(x, cfg.layout, cfg.dim)
    _check_params(params, rala_param_shapes(cfg), "rala_attention")
    validation.check_taps(taps)
    c, heads = cfg.dim, cfg.num_heads
    tok, h, w = _grid_to_tokens(x, cfg.layout)
    t = taps if taps is not None else {}

    q, k, v, g = _projections(tok, params, cfg)
    qh, kh, vh = (_split_heads(a, heads) for a in (q, k, v))
    t["q"], t["k"], t["v"], t["gate"] = qh, kh, vh, g

    core_taps: dict = {}
    y = _merge_heads(rala_core(qh, kh, vh, cfg, (h, w), taps=core_taps, max_elements=max_elements))
    t.update({"core." + name: val for name, val in core_taps.items()})
    t["core"] = y
    if cfg.lepe_kernel:
        kl = cfg.lepe_kernel
        lepe = layers.depthwise_conv2d(_tokens_to_cf(v, h, w), _param(params, "lepe.weight"),
                                       _param(params, "lepe.bias") if "lepe.bias" in params else None,
                                       padding=kl // 2)
        lepe = lepe.reshape(lepe.shape[0], c, h * w).transpose(0, 2, 1)
        t["lepe"] = lepe
        y = y + lepe
    t["pre_gate"] = y
    if g is not None:
        y = g * y                                       # Eq. 6: phi(X_i) (.) (...)
    t["gated"] = y
    if cfg.out_proj:
        y = layers.linear(y, _weight2d(params["proj.weight"], cfg.layout, "proj.weight", c, c),
                          params.get("proj.bias"))
    out = _tokens_to_grid(y, h, w, cfg.layout)
    t["out"] = out
    return out


def _projections(tok: np.ndarray, params: Mapping[str, Any], cfg: RALAConfig):
    """Q, K, V (B, N, C) and the gate phi(X) (B, N, C) or None."""
    c = cfg.dim
    if cfg.gate_source == "qkvo":
        wt = _weight2d(_param(params, "qkvo.weight"), cfg.layout, "qkvo.weight", 4 * c, c)
        p = layers.linear(tok, wt, params.get("qkvo.bias"))
        return p[..., :c], p[..., c:2 * c], p[..., 2 * c:3 * c], p[..., 3 * c:]
    wt = _weight2d(_param(params, "qkv.weight"), cfg.layout, "qkv.weight", 3 * c, c)
    p = layers.linear(tok, wt, params.get("qkv.bias"))
    if cfg.gate == "linear":
        g = layers.linear(tok, _weight2d(_param(params, "phi.weight"), cfg.layout, "phi.weight", c, c),
                          params.get("phi.bias"))
    elif cfg.gate == "identity":
        g = tok
    elif cfg.gate == "tanh":
        g = np.tanh(tok)
    else:
        g = None
    return p[..., :c], p[..., c:2 * c], p[..., 2 * c:], g


# ===================================================================================================
# The RAVLT block
# ===================================================================================================

def _norm(x: np.ndarray, p: Mapping[str, Any], prefix: str, cfg: RAVLTBlockConfig) -> np.ndarray:
    wgt, bias = _param(p, prefix + ".weight"), _param(p, prefix + ".bias")
    if cfg.attn.layout == "tokens":
        return layers.layer_norm(x, wgt, bias, cfg.norm_eps)
    return layers.layer_norm_cf(x, wgt, bias, cfg.norm_eps)


def ravlt_ffn(x: Any, params: Mapping[str, Any], cfg: RAVLTBlockConfig, *, taps: dict | None = None) -> np.ndarray:
    """The block's FFN: fc2(GELU(fc1 x)), or with ``ffn_dwconv`` fc2(h + DWConv3x3(h)), h = GELU(fc1 x).

    x : (B, H, W, C) or (B, C, H, W) (cfg.attn.layout).  params : "fc1.weight" (Hd, C[, 1, 1]), "fc1.bias",
    "dwconv.weight" (Hd, 1, 3, 3), "dwconv.bias" (with ffn_dwconv), "fc2.weight" (C, Hd[, 1, 1]), "fc2.bias".
    taps : "hidden" (after GELU), "dw" (after the conv residual), "out".  Returns x's shape.

    References: RALA §3.2 ("classic Transformer block ... FFN"); released code for ffn_dwconv.
    """
    validation.check_config(cfg, RAVLTBlockConfig)
    layout, c, hd = cfg.attn.layout, cfg.attn.dim, cfg.hidden
    x = _check_grid(x, layout, c)
    _check_params(params, _ffn_shapes(cfg), "ravlt_ffn")
    validation.check_taps(taps)
    tok, h, w = _grid_to_tokens(x, layout)
    t = taps if taps is not None else {}
    hid = numerics.gelu(layers.linear(tok, _weight2d(_param(params, "fc1.weight"), layout, "fc1.weight", hd, c),
                                      params.get("fc1.bias")))
    t["hidden"] = hid
    if cfg.ffn_dwconv:
        conv = layers.depthwise_conv2d(_tokens_to_cf(hid, h, w), _param(params, "dwconv.weight"),
                                       params.get("dwconv.bias"), padding=1)
        hid = hid + conv.reshape(conv.shape[0], hd, h * w).transpose(0, 2, 1)
        t["dw"] = hid
    y = layers.linear(hid, _weight2d(_param(params, "fc2.weight"), layout, "fc2.weight", c, hd),
                      params.get("fc2.bias"))
    out = _tokens_to_grid(y, h, w, layout)
    t["out"] = out
    return out


def ravlt_cpe(x: np.ndarray, params: Mapping[str, Any], cfg: RAVLTBlockConfig) -> np.ndarray:
    """x + DWConv_kxk(x) (CPE, Chu et al.; RALA §3.2) in the block's layout; the identity if cpe_kernel = 0."""
    validation.check_config(cfg, RAVLTBlockConfig)
    x = _check_grid(x, cfg.attn.layout, cfg.attn.dim)
    validation.check_mapping(params, "params", "a mapping of the block's state_dict keys to float arrays")
    pos = {k: s for k, s in ravlt_block_param_shapes(cfg).items() if k.startswith("pos.")}
    _check_params({k: v for k, v in params.items() if isinstance(k, str) and k.startswith("pos.")}, pos,
                  "ravlt_cpe (the 'pos.' entries of argument 'params')")
    if not cfg.cpe_kernel:
        return x
    cf = x if cfg.attn.layout == "channels_first" else np.moveaxis(x, -1, 1)
    out = layers.cpe(cf, _param(params, "pos.weight"), params.get("pos.bias"))
    return out if cfg.attn.layout == "channels_first" else np.moveaxis(out, 1, -1)


def _layerscale(y: np.ndarray, params: Mapping[str, Any], key: str, cfg: RAVLTBlockConfig) -> np.ndarray:
    """gamma (.) y with gamma (1, C, 1, 1) channels-first or (C,) tokens; the identity without layerscale."""
    if not cfg.layerscale:
        return y
    g = _param(params, key)
    want = (1, cfg.attn.dim, 1, 1) if cfg.attn.layout == "channels_first" else (cfg.attn.dim,)
    if g.shape != want:
        raise ArgumentError(f"parameter '{key}': expected shape {want}, got {g.shape}")
    return g * y


def ravlt_block(x: Any, params: Mapping[str, Any], cfg: RAVLTBlockConfig, *, taps: dict | None = None,
                max_elements: int | None = None) -> np.ndarray:
    """The RAVLT block: x1 = CPE(x); x2 = x1 + RALA(LN1(x1)); out = x2 + FFN(LN2(x2)) (with layerscale:
    x1 + gamma_1 (.) RALA(...), x2 + gamma_2 (.) FFN(...)).

    Parameters
    ----------
    x : (B, H, W, C) or (B, C, H, W) float (cfg.attn.layout).
    params : "pos.weight" (C,1,3,3), "pos.bias", "norm1.weight"/"norm1.bias" (C,), "attn.*" (see
        :func:`rala_attention`), "norm2.*", "ffn.*" (see :func:`ravlt_ffn`), "gamma_1"/"gamma_2" with
        layerscale.
    cfg : :class:`RAVLTBlockConfig`.
    taps : "cpe", "norm1", "attn", "res1", "norm2", "ffn", "out", and the layer's taps prefixed "attn.".

    Returns
    -------
    Array of x's shape.

    References
    ----------
    RALA §3.2 "Design of the block" and Fig. 6; CPE: Chu et al. (2023).
    """
    validation.check_max_elements(max_elements)
    validation.check_config(cfg, RAVLTBlockConfig)
    x = _check_grid(x, cfg.attn.layout, cfg.attn.dim)
    _check_params(params, ravlt_block_param_shapes(cfg), "ravlt_block")
    validation.check_taps(taps)
    t = taps if taps is not None else {}
    x1 = ravlt_cpe(x, params, cfg)
    t["cpe"] = x1
    n1 = _norm(x1, params, "norm1", cfg)
    t["norm1"] = n1
    attn_taps: dict = {}
    a = rala_attention(n1, layers.subparams(params, "attn"), cfg.attn, taps=attn_taps, max_elements=max_elements)
    t.update({"attn." + name: val for name, val in attn_taps.items()})
    t["attn"] = a
    x2 = x1 + _layerscale(a, params, "gamma_1", cfg)
    t["res1"] = x2
    n2 = _norm(x2, params, "norm2", cfg)
    t["norm2"] = n2
    f = ravlt_ffn(n2, layers.subparams(params, "ffn"), cfg)
    t["ffn"] = f
    out = x2 + _layerscale(f, params, "gamma_2", cfg)
    t["out"] = out
    return out


# ===================================================================================================
# Parameter shapes (the keys and shapes of the PyTorch twins' state_dicts)
# ===================================================================================================

def rala_param_shapes(cfg: RALAConfig) -> dict[str, tuple[int, ...]]:
    """{state_dict key: shape} of the RALA layer for ``cfg``."""
    validation.check_config(cfg, RALAConfig)
    c = cfg.dim
    tail = () if cfg.layout == "tokens" else (1, 1)
    out: dict[str, tuple[int, ...]] = {}
    if cfg.gate_source == "qkvo":
        out["qkvo.weight"] = (4 * c, c) + tail
        if cfg.qkv_bias:
            out["qkvo.bias"] = (4 * c,)
    else:
        out["qkv.weight"] = (3 * c, c) + tail
        if cfg.qkv_bias:
            out["qkv.bias"] = (3 * c,)
        if cfg.gate == "linear":
            out["phi.weight"] = (c, c) + tail
            if cfg.qkv_bias:
                out["phi.bias"] = (c,)
    if cfg.lepe_kernel:
        out["lepe.weight"] = (c, 1, cfg.lepe_kernel, cfg.lepe_kernel)
        out["lepe.bias"] = (c,)
    if cfg.out_proj:
        out["proj.weight"] = (c, c) + tail
        out["proj.bias"] = (c,)
    return out


def ravlt_block_param_shapes(cfg: RAVLTBlockConfig) -> dict[str, tuple[int, ...]]:
    """{state_dict key: shape} of the RAVLT block for ``cfg``."""
    validation.check_config(cfg, RAVLTBlockConfig)
    c, hd = cfg.attn.dim, cfg.hidden
    tail = () if cfg.attn.layout == "tokens" else (1, 1)
    out: dict[str, tuple[int, ...]] = {}
    if cfg.cpe_kernel:
        out["pos.weight"] = (c, 1, cfg.cpe_kernel, cfg.cpe_kernel)
        out["pos.bias"] = (c,)
    out["norm1.weight"], out["norm1.bias"] = (c,), (c,)
    out.update({"attn." + k: s for k, s in rala_param_shapes(cfg.attn).items()})
    out["norm2.weight"], out["norm2.bias"] = (c,), (c,)
    out["ffn.fc1.weight"], out["ffn.fc1.bias"] = (hd, c) + tail, (hd,)
    if cfg.ffn_dwconv:
        out["ffn.dwconv.weight"], out["ffn.dwconv.bias"] = (hd, 1, 3, 3), (hd,)
    out["ffn.fc2.weight"], out["ffn.fc2.bias"] = (c, hd) + tail, (c,)
    if cfg.layerscale:
        ls = (1, c, 1, 1) if cfg.attn.layout == "channels_first" else (c,)
        out["gamma_1"], out["gamma_2"] = ls, ls
    return out


# ===================================================================================================
# Error model
# ===================================================================================================
#
# A running bound on the absolute error of a computation in precision T, propagated stage by stage from
# the inputs (exact: the comparison rounds them to T first) to the output.  Every intermediate x carries
# E_x >= |fl_T(x) - x| element-wise.  Model (Higham 2002, eq. 2.8, gradual underflow): a product,
# quotient or library function result is (exact)(1 + delta) + eta, |delta| <= u, |eta| <= eta_T (half the
# smallest subnormal; c eta_T for a library function); additions and subtractions are exact in the
# subnormal range.  Rules (|.| element-wise; A+ = |A| + E_A; c = config.ELEMENTARY_FUNCTION_ULPS):
#
#   contraction with n roundings per term and p products per term, m terms (matmul, einsum):
#       E = gamma_n (A+)(B+) + E_A (B+) + |A| E_B + p m eta
#       (|fl(A'B') - A'B'| <= gamma_n |A'||B'| for any summation order - BLAS, GPU, threads - and
#       |A'B' - AB| <= E_A |B'| + |A| E_B); three factors: gamma_n (A+)(B+)(C+) + E_A (B+)(C+)
#       + |A| E_B (C+) + |A||B| E_C + p m eta;
#   a product with a constant rounded to T: two more roundings in n;
#   exp: |exp(x')(1 + c u) - exp(x)| <= exp(x) (exp(E_x)(1 + c u) - 1) + c eta;
#   quotient y = a / b with r roundings: E = (1 + gamma_r)(E_a + |y| E_b) / (|b| - E_b) + gamma_r |y|
#       + r eta, and +inf where E_b >= |b| (rounding may reach a zero normaliser: no bound exists).
#
# The result is returned as Bound(scale = E / gamma_K(u), k = K) so that the comparison's gamma_K(u) *
# scale is E exactly; K, the depth of the longest chain of roundings, is reported in the note (the
# comparison adds K eta_T on top).  Rigorous except for the libm accuracy assumption
# (config.ELEMENTARY_FUNCTION_ULPS) and the RoPE table's float64 accuracy (config.RALA_ROPE_TABLE_ULPS).
# The linear and quadratic orders share one bound: each term of kappa(Q_i) kappa(K_j)^T V_j passes
# through the same number of roundings (N + d) and products (2) in either association.


@dataclasses.dataclass(frozen=True)
class _Prec:
    """The tested precision: unit roundoff u, underflow unit eta, and the format its sums accumulate in
    (``config.ACCUMULATION_FORMAT``; :meth:`sums`)."""

    u: float
    eta: float
    dtype: str = "float64"

    @classmethod
    def of(cls, dtype: Any) -> "_Prec":
        return cls(numerics.unit_roundoff(dtype), numerics.underflow_eta(dtype), numerics.format_name(dtype))

    def g(self, n: float) -> float:
        """gamma_n(u_T); n may count mixed-precision sums as fractions of a rounding (:meth:`sums`): Higham's
        Lemma 3.1 holds with a unit roundoff per factor, |theta| <= sum u_i / (1 - sum u_i)."""
        return numerics.gamma(n, self.u)

    def sums(self, n: float) -> float:
        """The rounding count, in units of u_T, of an n-term sum whose result is stored in T
        (:func:`refimpl.verdict.sum_depth`: n, or n u_A / u_T + 1 with a wider accumulation format A)."""
        return numerics.sum_depth(n, self.dtype)


def _e_contract(spec: str, a, ea, b, eb, n: int, m: int, pr: _Prec) -> np.ndarray:
    """Error of einsum(spec, a, b) (m products per output, n roundings per term)."""
    ap, bp = np.abs(a) + ea, np.abs(b) + eb
    with np.errstate(over="ignore", invalid="ignore"):
        return (pr.g(n) * np.einsum(spec, ap, bp, optimize=True) + np.einsum(spec, ea, bp, optimize=True)
                + np.einsum(spec, np.abs(a), eb, optimize=True) + m * pr.eta)


def _e_contract3(spec: str, a, ea, b, eb, c, ec, n: int, m: int, pr: _Prec) -> np.ndarray:
    """Error of einsum(spec, a, b, c) (m terms per output, 2 products and n roundings per term)."""
    ap, bp, cp = np.abs(a) + ea, np.abs(b) + eb, np.abs(c) + ec
    with np.errstate(over="ignore", invalid="ignore"):
        return (pr.g(n) * np.einsum(spec, ap, bp, cp, optimize=True)
                + np.einsum(spec, ea, bp, cp, optimize=True)
                + np.einsum(spec, np.abs(a), eb, cp, optimize=True)
                + np.einsum(spec, np.abs(a), np.abs(b), ec, optimize=True) + 2 * m * pr.eta)


def _e_product(a, ea, b, eb, pr: _Prec) -> np.ndarray:
    """Error of the element-wise product a * b (one rounding)."""
    ap, bp = np.abs(a) + ea, np.abs(b) + eb
    return pr.g(1) * ap * bp + ea * bp + np.abs(a) * eb + pr.eta


def _e_sum2(a, ea, b, eb, pr: _Prec) -> np.ndarray:
    """Error of a + b (one rounding, no underflow term: additions are exact in the subnormal range)."""
    return ea + eb + pr.u * (np.abs(a) + np.abs(b) + ea + eb)


def _e_quotient(y, a_err, b, b_err, pr: _Prec, roundings: int = 2) -> np.ndarray:
    low = np.abs(b) - b_err
    gr = pr.g(roundings)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = (1 + gr) * (a_err + np.abs(y) * b_err) / low + gr * np.abs(y) + roundings * pr.eta
    return np.where(low > 0, e, np.inf)


def _e_linear(x, ex, wgt, bias, pr: _Prec) -> np.ndarray:
    """fl(x W^T + b) with x carrying E_x: gamma_{n+1}((|x| + E_x)|W|^T + |b|) + E_x |W|^T + n eta."""
    n = wgt.shape[1]
    aw = np.abs(wgt)
    s = (np.abs(x) + ex) @ aw.T
    if bias is not None:
        s = s + np.abs(bias)
    return pr.g(pr.sums(n) + (1 if bias is not None else 0)) * s + ex @ aw.T + n * pr.eta


def _e_depthwise(x, ex, wgt, bias, pr: _Prec) -> np.ndarray:
    """'same'-padded depthwise conv (B, C, H, W) of x carrying E_x: gamma_{k^2+1} on magnitudes, the
    propagated E_x, k^2 eta."""
    kk = wgt.shape[2] * wgt.shape[3]
    aw = np.abs(wgt)
    pad = wgt.shape[-1] // 2
    s = layers.depthwise_conv2d(np.abs(x) + ex, aw, None if bias is None else np.abs(bias), padding=pad)
    prop = layers.depthwise_conv2d(ex, aw, None, padding=pad)
    return pr.g(pr.sums(kk) + (1 if bias is not None else 0)) * s + prop + kk * pr.eta


def _e_kappa(x, ex, kernel: str, pr: _Prec) -> np.ndarray:
    """kappa(x') vs kappa(x) with |x' - x| <= E_x, kappa evaluated as x + 1 / exp(x) (elu1) or max(x, 0)."""
    if kernel == "relu":
        return ex                                              # 1-Lipschitz and exact
    c, u = config.ELEMENTARY_FUNCTION_ULPS, pr.u
    with np.errstate(over="ignore", invalid="ignore"):
        pos = ex + u * (np.abs(x + 1.0) + ex)                  # x' + 1, one rounding
        neg = np.exp(np.minimum(x, 0.0)) * (np.exp(ex) * (1 + c * u) - 1.0) + c * pr.eta
        # |x| <= E_x: x' may fall on the other branch; |(x + 1) - exp(x)| <= x^2 / 2 there.
        return np.where(np.abs(x) <= ex, np.maximum(pos, neg) + ex * ex, np.where(x > 0, pos, neg))


def _e_rope(x, ex, angles, pr: _Prec) -> np.ndarray:
    """Rotation of pairs with a table computed in float64 and rounded once to T:
    |table - exact| <= u |entry| + eta + gamma_R(u_64)(1 + |theta|), R = config.RALA_ROPE_TABLE_ULPS."""
    c, s = np.cos(angles), np.sin(angles)
    t_err = numerics.gamma(config.RALA_ROPE_TABLE_ULPS, numerics.unit_roundoff("float64")) * (1.0 + np.abs(angles))
    ec, es = pr.u * np.abs(c) + pr.eta + t_err, pr.u * np.abs(s) + pr.eta + t_err
    xe, xo, ee, eo = x[..., 0::2], x[..., 1::2], ex[..., 0::2], ex[..., 1::2]
    ce, se, ece, ese = c[:, 0::2], s[:, 0::2], ec[:, 0::2], es[:, 0::2]   # a pair's two channels share theta
    g2 = pr.g(2)

    def pair(a, ea, b, eb):  # a cos -/+ b sin: 2 products, 1 sum
        return (g2 * ((np.abs(a) + ea) * (np.abs(ce) + ece) + (np.abs(b) + eb) * (np.abs(se) + ese))
                + ea * (np.abs(ce) + ece) + np.abs(a) * ece + eb * (np.abs(se) + ese) + np.abs(b) * ese
                + 2 * pr.eta)

    out = np.empty_like(ex)
    out[..., 0::2] = pair(xe, ee, xo, eo)
    out[..., 1::2] = pair(xo, eo, xe, ee)
    return out


def _core_error(q, eq, k, ek, v, ev, cfg: RALAConfig, hw, pr: _Prec) -> tuple[np.ndarray, float]:
    """(E_out, K) for :func:`rala_core` computed in precision pr, inputs carrying errors eq, ek, ev."""
    c = config.ELEMENTARY_FUNCTION_ULPS
    kq, kk = kappa(q, cfg.kernel), kappa(k, cfg.kernel)
    ekq, ekk = _e_kappa(q, eq, cfg.kernel, pr), _e_kappa(k, ek, cfg.kernel, pr)
    depth = c + 1
    if cfg.reweight:
        alpha, ealpha, d_alpha = _alpha_error(q, eq, kq, ekq, kk, ekk, cfg, pr)
        depth += d_alpha
    else:
        alpha, ealpha = np.ones(q.shape[:-1]), np.zeros(q.shape[:-1])
    kw = alpha[..., None] * kk
    ekw = _e_product(alpha[..., None], ealpha[..., None], kk, ekk, pr) + pr.eta   # k * softmax * N: 2 products
    depth += 2
    ey, d_att = _attention_error(kq, ekq, kw, ekw, v, ev, cfg, hw, pr)
    return ey, depth + d_att


def _alpha_error(q, eq, kq, ekq, kk, ekk, cfg: RALAConfig, pr: _Prec) -> tuple[np.ndarray, np.ndarray, float]:
    """(alpha, E_alpha, depth) of Eq. 4's weights alpha = N softmax(scale mean(Q or kappa(Q)) kappa(K)^T)."""
    s, es, d_s = _scores_error(q, eq, kq, ekq, kk, ekk, cfg, pr)
    alpha, ealpha, d_a = _softmax_alpha_error(s, es, pr)
    return alpha, ealpha, d_s + d_a


def _scores_error(q, eq, kq, ekq, kk, ekk, cfg: RALAConfig, pr: _Prec) -> tuple[np.ndarray, np.ndarray, float]:
    """(s, E_s, depth) of Eq. 4's logits s_j = scale q_g . kappa(K_j), q_g the token mean of Q or kappa(Q)."""
    n, d = q.shape[-2], q.shape[-1]
    u = pr.u
    src, esrc = (q, eq) if cfg.global_query == "q" else (kq, ekq)
    q_g = np.mean(src, axis=-2, keepdims=True)
    # mean: a sum of n terms (gamma_{n-1}) and one division
    eqg = (np.sum(esrc, axis=-2, keepdims=True) * (1 + u)
           + pr.g(pr.sums(n)) * np.sum(np.abs(src) + esrc, axis=-2, keepdims=True)) / n + pr.eta
    scale = d ** -0.5 if cfg.alpha_scale == "head_dim" else 1.0
    n_s = pr.sums(d) + (2 if scale != 1.0 else 0)          # the rounded scale and its product
    s = scale * (q_g @ kk.swapaxes(-1, -2))[..., 0, :]
    es = scale * _e_contract("bhxd,bhnd->bhxn", q_g, eqg, kk, ekk, n_s, 2 * d, pr)[..., 0, :]
    return s, es, pr.sums(n) + 1 + n_s


def _softmax_alpha_error(s, es, pr: _Prec) -> tuple[np.ndarray, np.ndarray, float]:
    """(alpha, E_alpha, depth) of alpha = N softmax(s) for logits s carrying absolute errors E_s."""
    n = s.shape[-1]
    c, u = config.ELEMENTARY_FUNCTION_ULPS, pr.u
    # softmax by max-subtraction: the shift cancels in the ratio; fl(s'_j - m') adds u |s'_j - m'|.
    # Relative error of alpha_j = N e_j / sum e, with |logit error_l| <= delta_l: e^{delta_j} / sum_l p_l
    # e^{-delta_l} - 1 above, 1 - e^{-delta_j} / sum_l p_l e^{delta_l} below (p the exact softmax), both at most
    # A - 1 with A = e^{delta_j} sum_l p_l e^{delta_l} (Cauchy-Schwarz: (sum p e^d)(sum p e^-d) >= 1, and
    # 1 - 1/A <= A - 1): exp(delta_j) (sum_l p_l exp(delta_l)) (1 + c u)(1 + gamma_3) / ((1 - c u)(1 - gamma_n)) - 1
    # (the quotient, x N and one spare rounding).  The p-weighted mean, not the max, of exp(delta_l): a
    # token with a large logit error but a small weight moves the sum little.  Underflowing exp terms
    # add c eta each, divided by sum e >= 1 (it contains exp(0) = 1) and multiplied by N.  With a wider
    # accumulation format (config.ACCUMULATION_FORMAT) the softmax is one operation evaluated in it: the
    # argument's rounding and exp's c ulps count u_A (ua); the logits it reads and alpha are in T.
    ua = u * numerics.accumulation_ratio(pr.dtype)
    m = np.max(s, axis=-1, keepdims=True)
    es_max = np.max(es, axis=-1, keepdims=True)
    delta = es + ua * (np.abs(s - m) + es + es_max)
    p = numerics.softmax(s, axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        fac = (np.exp(delta) * np.sum(p * np.exp(delta), axis=-1, keepdims=True) * (1 + c * ua) * (1 + pr.g(3))
               / ((1 - c * ua) * (1 - pr.g(pr.sums(n)))))
    alpha = n * p
    ealpha = alpha * (fac - 1.0) + n * (c + 3) * pr.eta * (1.0 + alpha)
    return alpha, ealpha, c + pr.sums(n) + 3


def _numerator_denominator(kq, kw, v, cfg: RALAConfig, hw) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 2-3's numerator (B, h, N, d) and normaliser (B, h, N), before its + eps, from kappa(Q), the weighted
    keys and V: RoPE on the numerator's operands and the token scaling (the mean), as :func:`rala_core`."""
    n, d = kq.shape[-2], kq.shape[-1]
    if cfg.rope:
        ang = rope_2d_angles(hw[0], hw[1], d, cfg.rope_base)
        qn, kn = apply_rope_2d(kq, ang), apply_rope_2d(kw, ang)
    else:
        qn, kn = kq, kw
    norm = 1.0 / n if cfg.token_scaling == "mean" else 1.0
    num = norm * np.einsum("bhia,bhja,bhje->bhie", qn, kn, v, optimize=True)
    den = norm * np.einsum("bhia,bhja->bhi", kq, kw, optimize=True)
    return num, den


def _attention_parts_error(kq, ekq, kw, ekw, v, ev, cfg: RALAConfig, hw, pr: _Prec):
    """The numerator and denominator of Eq. 2-3 from kappa(Q), the reweighted keys and V (with RoPE on the
    numerator's operands and the token scaling): (num, E_num, den, E_den, depth) with den including eps."""
    n, d = kq.shape[-2], kq.shape[-1]
    depth = 0.0
    if cfg.rope:
        ang = rope_2d_angles(hw[0], hw[1], d, cfg.rope_base)
        qn, kn = apply_rope_2d(kq, ang), apply_rope_2d(kw, ang)
        eqn, ekn = _e_rope(kq, ekq, ang, pr), _e_rope(kw, ekw, ang, pr)
        depth += 3
    else:
        qn, kn, eqn, ekn = kq, kw, ekq, ekw
    mean = cfg.token_scaling == "mean"
    norm = 1.0 / n if mean else 1.0
    # numerator: sum_a sum_j qn_ia kn_ja v_je; n + d roundings per term (+4: (HW)^(-1/2) twice, rounded,
    # and their two products), 2 products per term (+2 for the scalings)
    n_num = pr.sums(n) + pr.sums(d) + (4 if mean else 0)
    num, den = _numerator_denominator(kq, kw, v, cfg, hw)
    enum = norm * _e_contract3("bhia,bhja,bhje->bhie", qn, eqn, kn, ekn, v, ev, n_num, n * d, pr) \
        + (2 * n * d * pr.eta if mean else 0.0)
    # denominator: sum_a sum_j kq_ia kw_ja (/ N), + eps
    n_den = pr.sums(n) + pr.sums(d) + (1 if mean else 0)
    eden = norm * _e_contract("bhia,bhja->bhi", kq, ekq, kw, ekw, n_den, d, pr) + (2 * d * pr.eta if mean else 0.0)
    if cfg.eps:
        eden = _e_sum2(den, eden, cfg.eps, 0.0, pr)
        den = den + cfg.eps
    return num, enum, den, eden, depth + n_num


def _attention_error(kq, ekq, kw, ekw, v, ev, cfg: RALAConfig, hw, pr: _Prec) -> tuple[np.ndarray, float]:
    """(E_out, depth) of out = numerator / denominator (:func:`_attention_parts_error`)."""
    num, enum, den, eden, depth = _attention_parts_error(kq, ekq, kw, ekw, v, ev, cfg, hw, pr)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = num / den[..., None]
    return _e_quotient(y, enum, den[..., None], eden[..., None], pr, roundings=2), depth + 3


# ---------------------------------------------------------------------------------------------------
# The l2 (probabilistic) coefficient sigma (numerics.Bound.sigma; docs/design.md "The verdict", item 2)
# ---------------------------------------------------------------------------------------------------
#
# Beside E, :func:`rala_core_bound` and :func:`rala_attention_bound` carry sigma >= sqrt(sum_r c_r^2), in units
# of u_T, over the roundings r of the computation (c_r the coefficient of rounding r in the output's first-order
# error; O(u^2) neglected, as in FLatten's sigma: first-order, not rigorous where E's second-order terms matter).
# Under Higham & Mary's model (independent, mean-zero rounding errors) |err_i| <= lam u sigma_i with probability
# >= 1 - 2 exp(-lam^2 / 2) (Azuma-Hoeffding), and the verdict uses min(E, lam u sigma).  The construction is
# FLatten's (refimpl.attention.focused, "The error model"):
#
# - an n-term sum counts sqrt(numerics.sum_depth_l2(n)) S instead of sum_depth(n) S;
# - an element-wise operation's rounding keeps its l1 size (coefficient |result| + eta_T / u_T: the error of one
#   rounding, gradual underflow included; a c-ulp library function: c times that);
# - an input's coefficient propagates through the same absolute Jacobian, |J| sigma (Minkowski: valid whatever
#   roundings the inputs share), and sets of roundings known to be disjoint join in quadrature:
#   sum_r c_r^2 = sum_G sum_{r in G} c_r^2 over a partition of the roundings into groups G;
# - sigma is capped at E / u_T (E >= u sum_r |c_r| >= u sqrt(sum_r c_r^2)).
#
# The disjoint groups of the core, for output element (i, e) (proved in :func:`_core_sigma`): the roundings of
# each key token j (its K and V entries - each projected entry is its own inner product when the module input is
# exact - kappa(K_j), its logit's, its softmax output's, alpha_j kappa(K_j), RoPE and the token scaling of its
# rows: in quadrature over j, :func:`refimpl.attention.focused._token_quadrature`); the queries' (every Q entry,
# kappa(Q), Q_g's own, RoPE of kappa(Q_i)); the RoPE table's (shared by the tokens of a grid row or column); and the
# contractions' own (numerator, normaliser, quotient).  A rounding shared by every alpha_j (the softmax's sum, the
# logits' common shift) scales numerator and normaliser alike and cancels in their quotient, up to the eps term.


def _kappa_sigma(x: np.ndarray, sx: np.ndarray, kernel: str, pr: _Prec) -> np.ndarray:
    """sigma of kappa(x~) for x~ carrying sigma ``sx`` (units of u_T): the derivative times sx (1 or exp(x);
    relu: 1 or 0) in quadrature with kappa's own rounding of the same entry (x + 1: one rounding; exp: c ulps,
    l1 size), which is disjoint from the input's roundings."""
    eu = pr.eta / pr.u
    if kernel == "relu":
        return np.where(x >= 0, sx, 0.0)                       # exact, 1-Lipschitz
    c = config.ELEMENTARY_FUNCTION_ULPS
    with np.errstate(over="ignore"):
        ex = np.exp(np.minimum(x, 0.0))
    own = np.where(x > 0, np.abs(x + 1.0) + eu, c * (ex + eu))
    return np.hypot(np.where(x > 0, 1.0, ex) * sx, own)


def _rope_table_error(angles: np.ndarray, pr: _Prec) -> tuple[np.ndarray, np.ndarray]:
    """The cos / sin tables' error in units of u_T (as :func:`_e_rope`: one rounding to T, gradual underflow, and
    the float64 evaluation's gamma_R(u_64)(1 + |theta|), a deterministic term kept at its l1 size)."""
    c, s = np.cos(angles), np.sin(angles)
    t_err = numerics.gamma(config.RALA_ROPE_TABLE_ULPS, numerics.unit_roundoff("float64")) * (1.0 + np.abs(angles))
    eu = pr.eta / pr.u
    return np.abs(c) + eu + t_err / pr.u, np.abs(s) + eu + t_err / pr.u


def _rope_sigma(x: np.ndarray, sx: np.ndarray, angles: np.ndarray, pr: _Prec) -> tuple[np.ndarray, np.ndarray]:
    """(sigma of RoPE(x~) without the table's roundings, the table's l1 coefficient) for x~ carrying sigma ``sx``.

    Output 2p is x_2p cos - x_2p+1 sin: the inputs through |cos|, |sin| (Minkowski: the pair may share
    roundings), in quadrature with the entry's own three roundings (two products, one difference; each of
    coefficient at most its own magnitude + eta_T / u_T, disjoint from the inputs' and from each other); the
    table's roundings (cos, sin of the token's angle, shared with the tokens of the same angle) are returned apart:
    |x_2p| e_cos + |x_2p+1| e_sin."""
    c, s = np.cos(angles), np.sin(angles)
    ec, es = _rope_table_error(angles, pr)
    eu = pr.eta / pr.u
    out = apply_rope_2d(x, angles)
    sig, tab = np.empty_like(sx), np.empty_like(sx)
    for part, (a, sa, b, sb) in ((slice(0, None, 2), (x[..., 0::2], sx[..., 0::2], x[..., 1::2], sx[..., 1::2])),
                                  (slice(1, None, 2), (x[..., 1::2], sx[..., 1::2], x[..., 0::2], sx[..., 0::2]))):
        cc, ss, ecc, ess = c[:, part], s[:, part], ec[:, part], es[:, part]
        prop = np.abs(cc) * sa + np.abs(ss) * sb
        own = np.sqrt((np.abs(a * cc) + eu) ** 2 + (np.abs(b * ss) + eu) ** 2 + (np.abs(out[..., part]) + eu) ** 2)
        sig[..., part] = np.hypot(prop, own)
        tab[..., part] = np.abs(a) * ecc + np.abs(b) * ess
    return sig, tab


def _quadratic_own_sq(qn: np.ndarray, kn_s: np.ndarray, v_s: np.ndarray, pr: _Prec, block: int = 1024) -> np.ndarray:
    """sum_j v_s_je^2 (d r^2 S_A_ij^2 + (|A_ij| + eta/u)^2), A = qn kn_s^T: the squared l2 count of the quadratic
    order's score matrix roundings (its d-term sums in the accumulation format, r = u_A / u_T, and its rounding
    to T), query rows in blocks (memory O(block N) per head)."""
    d, r, eu = qn.shape[-1], numerics.accumulation_ratio(pr.dtype), pr.eta / pr.u
    out = np.empty(qn.shape[:-1] + (v_s.shape[-1],))
    v2 = v_s * v_s
    for i0 in range(0, qn.shape[-2], block):
        rows = slice(i0, i0 + block)
        a = qn[..., rows, :] @ kn_s.swapaxes(-1, -2)
        sa = np.abs(qn[..., rows, :]) @ np.abs(kn_s).swapaxes(-1, -2)
        out[..., rows, :] = (d * r * r * sa * sa + (np.abs(a) + eu) ** 2) @ v2
    return out


def _core_sigma(q, sq, k, sk, v, sv, cfg: RALAConfig, hw, pr: _Prec) -> np.ndarray:
    """sigma (units of u_T, (B, h, N, d)) of :func:`rala_core` computed in precision pr, for inputs whose entries
    carry sigmas sq, sk, sv from disjoint sets of roundings, one set per entry (exact inputs: 0; the module's
    projections: every entry its own inner product).  The tested code's operations are the twin's
    (equivalence/modules/rala.py): kappa; Q_g = mean, times d^-1/2; logits Q_g kappa(K)^T; the softmax; kappa(K)
    softmax N; RoPE; K and V times N^-1/2 (token scaling "mean"); the numerator in either order; the normaliser
    kappa(Q) mean_j(alpha_j kappa(K_j)) (+ eps); num (1 / den) or num / den.

    First order, the output's error is sum_r c_r delta_r.  With G_ije = alpha_j dy_ie / dalpha_j =
    norm (A_ij v_je - y_ie B_ij) / den_i (A_ij = qn_i . kn_j, B_ij = kappa(Q_i) . alpha_j kappa(K_j), norm 1 / N
    or 1, den including eps) and alpha_j's relative error ds_j - sbar + rho_j (ds_j its logit's error, sbar =
    sum_l p_l ds_l plus the softmax sum's rounding, shared, rho_j its own roundings), sum_j G_ije = y_ie eps /
    den_i: the shared sbar enters only as -sbar y eps / den (a common factor of every alpha_j cancels in
    numerator / normaliser).  The roundings fall into four disjoint groups, joined in quadrature:

    G1, key token j (K_j and V_j entries, kappa(K_j), the logit s_j's dot product and scale product, the softmax's
        shifted argument, exp and quotient for j, the stored softmax, the products by N and kappa(K_j), RoPE and
        N^-1/2 of alpha_j kappa(K_j) and V_j): disjoint between tokens, so sqrt(sum_j t_ije^2) with, within the
        token (Minkowski), t_ije = norm / den_i [(|qn_i| . s_kn_j) |v_je| + (|qn_i| . |kn_j|) s_v_je
        + |y_ie| (kappa(Q_i) . s_kw_j)], s_kw_j = alpha_j s_kk_j + |kappa(K_j)| s_alpha_j + product roundings;
        the two parts by :func:`refimpl.attention.focused._token_quadrature` and kq_i^T (sum_j s_kw_j s_kw_j^T)
        kq_i, added (Minkowski over j's vectors).
    G2, the queries (Q entries, kappa(Q), RoPE's own roundings of kappa(Q_i), Q_g's sum, division and scale
        product, the rounded constant d^-1/2): row i's own entries through the exact Jacobian of y_i in kappa(Q_i),
        norm (R_i^T Bm - y_i zs) / den_i (Bm = kn^T v, zs = sum_j kw_j, R_i the rotation), in quadrature over
        the entries (each entry its own roundings); Q_g's entries (disjoint between channels a, each the mean of
        n entries in quadrature plus its own roundings) through their exact first-order coefficient
        scale |sum_j G_ije kappa(K_ja)| (signed sum, plus its float64 evaluation error), in quadrature over a; the
        constant through |sum_j G_ije s_j| likewise; the three added (Q_i's entries are in Q_g too).
    G3, the RoPE table (an entry is shared by the tokens whose angle it is: one grid row or column, so each
        table rounding is used by at most H + W - 1 tokens and, by Cauchy-Schwarz, sum_rho (sum_j c_rho,j)^2 <=
        (H + W - 1) sum_j (sum_rho |c_rho,j|)^2): sqrt(H + W - 1) sqrt(sum_j t_ije^2) for the keys plus the
        query row's own entries (l1), added.
    G4, the contractions' own roundings (for either order: Bm's or A's d- or n-term sums, r = u_A / u_T per
        rounding in the accumulation format, and their roundings to T; the numerator's; the constant N^-1/2,
        used twice; zs, the normaliser, eps, the reciprocal and product): every rounding's coefficient written
        out, the sum of their squares taken.
    Then sigma = sqrt(G1^2 + G2^2 + G3^2 + G4^2) + |y| eps / den sigma_sbar (sbar's roundings overlap G1, G2).
    """
    n, d = q.shape[-2], q.shape[-1]
    c = config.ELEMENTARY_FUNCTION_ULPS
    eu, r = pr.eta / pr.u, numerics.accumulation_ratio(pr.dtype)
    ea = numerics.underflow_eta(verdict.accumulation_format(pr.dtype)) / pr.u
    l2 = lambda m: numerics.sum_depth_l2(m, pr.dtype)
    kq, kk = kappa(q, cfg.kernel), kappa(k, cfg.kernel)
    skq, skk = _kappa_sigma(q, sq, cfg.kernel, pr), _kappa_sigma(k, sk, cfg.kernel, pr)
    akk = np.abs(kk)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if cfg.reweight:
            q_g, scale, alpha = _reweighting(q, kq, kk, cfg)
            src, ssrc = (q, sq) if cfg.global_query == "q" else (kq, skq)
            rounded = scale != 1.0
            # Q_g_a: the n entries' roundings in quadrature (disjoint), its own (the sum, the division, the product
            # with the scale in the twin's order) added
            sqg = np.hypot(np.sqrt(np.sum(ssrc * ssrc, axis=-2, keepdims=True)) / n,
                           math.sqrt(l2(n)) * np.sum(np.abs(src), axis=-2, keepdims=True) / n
                           + (2.0 if rounded else 1.0) * (np.abs(q_g) + eu))
            s = scale * (q_g @ kk.swapaxes(-1, -2))[..., 0, :]
            s_mag = scale * (np.abs(q_g) @ akk.swapaxes(-1, -2))[..., 0, :]
            # token j's part of its logit: kappa(K_j)'s entries in quadrature (disjoint), the d-term dot product,
            # and the scale product in the reference's order
            tok_s = np.hypot(scale * np.sqrt(((q_g * q_g) @ (skk * skk).swapaxes(-1, -2))[..., 0, :]),
                             verdict.sum_rounding_l2(d, s_mag, s, pr.dtype)
                             + (1.0 if rounded else 0.0) * (np.abs(s) + eu))
            m = np.max(s, axis=-1, keepdims=True)
            # softmax_j's own: the shifted argument, exp (c ulps) and the quotient in A, stored in T, times N
            rho = r * (np.abs(s - m) + c + 1.0) + 2.0
            # underflow: the softmax stored in T (then times N: N eta_T), and the c + 1 operations in A
            s_alpha = alpha * np.hypot(tok_s, rho) + n * (eu + (c + 1.0) * ea)
            p = numerics.softmax(s, axis=-1)
            qg_part = scale * (sqg @ akk.swapaxes(-1, -2))[..., 0, :]
            sig_sbar = (np.sum(p * (tok_s + qg_part + (np.abs(s) if rounded else 0.0) + rho), axis=-1)
                        + math.sqrt(l2(n)))
        else:
            alpha, s_alpha = np.ones(q.shape[:-1]), np.zeros(q.shape[:-1])
        kw = alpha[..., None] * kk
        s_kw = skk
        if cfg.reweight:    # kappa(K) softmax (of size kw / N: its underflow is N eta_T in kw's units), then times N
            s_kw = alpha[..., None] * skk + akk * s_alpha[..., None] + 2.0 * np.abs(kw) + (n + 1.0) * eu
        if cfg.rope:
            ang = rope_2d_angles(hw[0], hw[1], d, cfg.rope_base)
            qn, kn = apply_rope_2d(kq, ang), apply_rope_2d(kw, ang)
            s_qn_own, tab_q = _rope_sigma(kq, np.zeros_like(kq), ang, pr)
            s_kn, tab_k = _rope_sigma(kw, s_kw, ang, pr)
        else:
            qn, kn, s_kn = kq, kw, s_kw
        mean = cfg.token_scaling == "mean"
        norm = 1.0 / n if mean else 1.0
        s_v = sv
        if mean:    # K and V times N^-1/2: one rounding per entry, in token j's group (underflow: N^1/2 eta_T)
            s_kn = s_kn + np.abs(kn) + math.sqrt(n) * eu
            s_v = sv + np.abs(v) + math.sqrt(n) * eu
        bm = kn.swapaxes(-1, -2) @ v                               # (B, h, d, e), unscaled
        zs = np.sum(kw, axis=-2)                                   # (B, h, d)
        num = norm * (qn @ bm)
        den = norm * np.einsum("bhia,bha->bhi", kq, zs)
        den_e = (den + cfg.eps)[..., None]
        den_eff = np.abs(den_e)
        y = num / den_e
        ay = np.abs(y)
        f = norm / den_eff
        aqn = np.abs(qn)

        # G1: the key tokens
        g1 = f * (_token_quadrature(aqn, np.abs(kn), np.abs(v), s_kn, s_v, np.zeros_like(y))
                  + ay * np.sqrt(np.maximum(np.einsum("zhia,zhab,zhib->zhi", np.abs(kq), s_kw.swapaxes(-1, -2) @ s_kw,
                                                      np.abs(kq)),
                                            0.0))[..., None])

        # G2: the queries
        g2 = np.empty_like(y)
        for b in range(q.shape[0]):
            for hh in range(q.shape[1]):
                bt = np.broadcast_to(bm[b, hh].T[:, None, :], (d, n, d))   # (e, i, a)
                pt = (apply_rope_2d(bt, -ang) if cfg.rope else bt).transpose(1, 0, 2)   # R_i^T Bm: (i, e, a)
                coef = f[b, hh][..., None] * (pt - y[b, hh][..., None] * zs[b, hh])
                direct = np.einsum("iea,ia->ie", coef * coef, skq[b, hh] ** 2)
                if cfg.rope:
                    direct = direct + (f[b, hh] ** 2) * ((s_qn_own[b, hh] ** 2) @ (bm[b, hh] ** 2))
                g2[b, hh] = np.sqrt(direct)
        if cfg.reweight:
            # Q_g's entry a moves every logit by scale dQ_g,a kappa(K_ja): its coefficient on y_ie is the exact
            # first-order sum H_iea = scale sum_j G_ije kappa(K_ja) = scale norm / den_i [qn_i . T1[:, e, a] - y_ie
            # kappa(Q_i) . T2[:, a]], T1 = sum_j kn_jb v_je kappa(K_ja), T2 = sum_j kw_jb kappa(K_ja) (signed: the
            # G_ije sum to y eps / den over j, so a perturbation common to the logits nearly cancels); its float64
            # evaluation error, gamma_{N+d+4}(u_64) times the same sum on magnitudes, is added.  The rounded constant
            # d^-1/2 (one rounding, ds_j = delta s_j) the same way with s_j for kappa(K_ja).
            g64 = numerics.gamma(n + d + 4, numerics.unit_roundoff("float64"))
            avb, akn, akw, akq = np.abs(v), np.abs(kn), np.abs(kw), np.abs(kq)
            for b in range(q.shape[0]):
                for hh in range(q.shape[1]):
                    fb, yb = f[b, hh], y[b, hh]
                    t1 = np.einsum("jb,je,ja->bea", kn[b, hh], v[b, hh], kk[b, hh], optimize=True)
                    t1a = np.einsum("jb,je,ja->bea", akn[b, hh], avb[b, hh], akk[b, hh], optimize=True)
                    hs = fb[..., None] * (np.einsum("ib,bea->iea", qn[b, hh], t1, optimize=True)
                                          - yb[..., None] * (kq[b, hh] @ (kw[b, hh].T @ kk[b, hh]))[:, None, :])
                    ha = fb[..., None] * (np.einsum("ib,bea->iea", aqn[b, hh], t1a, optimize=True)
                                          + np.abs(yb)[..., None]
                                          * (akq[b, hh] @ (akw[b, hh].T @ akk[b, hh]))[:, None, :])
                    hmat = np.abs(hs) + g64 * ha
                    g2[b, hh] += scale * np.sqrt(np.einsum("iea,a->ie", hmat * hmat, sqg[b, hh, 0] ** 2))
                    if rounded:
                        sb = s[b, hh][:, None]
                        cs = fb * (qn[b, hh] @ (kn[b, hh].T @ (sb * v[b, hh])) - yb * (kq[b, hh] @ (kw[b, hh].T @ sb)))
                        ca = fb * (aqn[b, hh] @ (akn[b, hh].T @ (np.abs(sb) * avb[b, hh]))
                                   + np.abs(yb) * (akq[b, hh] @ (akw[b, hh].T @ np.abs(sb))))
                        g2[b, hh] += np.abs(cs) + g64 * ca

        # G3: the RoPE table
        g3 = 0.0
        if cfg.rope:
            g3 = f * (math.sqrt(hw[0] + hw[1] - 1) * _token_quadrature(aqn, np.abs(kn), np.abs(v), tab_k,
                                                                      np.zeros_like(v), np.zeros_like(y))
                      + tab_q @ np.abs(bm))

        # G4: the contractions' own roundings
        sn = math.sqrt(norm)
        kn_s, v_s = sn * kn, sn * v
        bm_s, sbm_s = norm * bm, norm * (np.abs(kn).swapaxes(-1, -2) @ np.abs(v))
        s3 = aqn @ sbm_s
        lin = (qn * qn) @ (n * r * r * sbm_s ** 2 + (np.abs(bm_s) + eu) ** 2) + d * r * r * s3 ** 2
        quad = _quadratic_own_sq(qn, kn_s, v_s, pr) + n * r * r * s3 ** 2
        num_sq = np.maximum(lin, quad) + (np.abs(num) + eu) ** 2 + (4.0 * num * num if mean else 0.0)
        z, sz = norm * zs, norm * np.sum(np.abs(kw), axis=-2)
        sden = np.einsum("bhia,bha->bhi", np.abs(kq), sz)
        den_sq = (np.einsum("bhia,bha->bhi", kq * kq, n * r * r * sz ** 2 + 2.0 * (np.abs(z) + eu) ** 2)
                  + d * r * r * sden ** 2 + (np.abs(den) + eu) ** 2)
        if cfg.eps:
            den_sq = den_sq + (np.abs(den + cfg.eps) + eu) ** 2
        # the quotient: the reciprocal (its underflow eta_T times |num|) and the product, or one division
        g4 = np.sqrt(num_sq / den_eff ** 2 + ay * ay * den_sq[..., None] / den_eff ** 2
                     + (ay + np.abs(num) * eu) ** 2 + (ay + eu) ** 2)

        sigma = np.sqrt(g1 * g1 + g2 * g2 + g3 * g3 + g4 * g4)
        if cfg.reweight and cfg.eps:
            sigma = sigma + ay * cfg.eps / den_eff * sig_sbar[..., None, None]
    return sigma


def _sum_own_sq(n: int, magnitude, value, bias, pr: _Prec) -> np.ndarray:
    """The squared l2 coefficient of an n-term inner product's own roundings stored in T (verdict.sum_rounding_l2
    on the sum without the bias) and, with a bias, of the separate bias addition's rounding (|result| + eta/u)."""
    if bias is None:
        return verdict.sum_rounding_l2(n, magnitude, value, pr.dtype) ** 2
    return (verdict.sum_rounding_l2(n, magnitude - np.abs(bias), value - bias, pr.dtype) ** 2
            + (np.abs(value) + pr.eta / pr.u) ** 2)


def _attention_sigma(tok: np.ndarray, params: Mapping[str, Any], cfg: RALAConfig, hw: tuple[int, int],
                     pr: _Prec) -> np.ndarray:
    """sigma (units of u_T, tokens (B, N, C)) of :func:`rala_attention` on exact x (see the section's comment).

    The fused projection's entries are each its own inner product (:func:`_sum_own_sq`): disjoint rounding sets,
    as :func:`_core_sigma` needs.  After the core, every element carries three parts: ``shared``, the core's sigma,
    whose roundings the channels of a token share (alpha, the normaliser); ``vpart``, LePE's propagated part
    sqrt(conv(s_v^2, W^2)) (V's entries in quadrature, being disjoint), whose roundings (channel e's V entries) are
    disjoint between channels but held by the core's key-token groups too, so that it is added to ``shared``
    (Minkowski) once the channels are combined; and ``own``, the roundings made for that element alone (LePE's own
    sums, the addition, the gate's projection entry or tanh, the gate product), disjoint between elements and from
    the other two.  The gate multiplies all by |g| and adds |y| sigma_g and the product's rounding to ``own``; the
    output projection takes ``shared`` through |W| (Minkowski), ``vpart`` and ``own`` through W^2 (quadrature over
    the channels), and adds its own sums: (|W| shared + sqrt(W^2 vpart^2))^2 + W^2 own^2 + its own^2."""
    c, (h, w) = cfg.dim, hw
    eu = pr.eta / pr.u
    bias = lambda key: None if params.get(key) is None else numerics.as_float(params[key], key)

    def proj(key, rows, x):
        wt = _weight2d(_param(params, key + ".weight"), cfg.layout, key + ".weight", rows, x.shape[-1])
        bt = bias(key + ".bias")
        y = layers.linear(x, wt, bt)
        mag = layers.linear(np.abs(x), np.abs(wt), None if bt is None else np.abs(bt))
        return y, np.sqrt(_sum_own_sq(x.shape[-1], mag, y, bt, pr)), wt

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if cfg.gate_source == "qkvo":
            p, sp_, _ = proj("qkvo", 4 * c, tok)
            g, sg = p[..., 3 * c:], sp_[..., 3 * c:]
        else:
            p, sp_, _ = proj("qkv", 3 * c, tok)
            if cfg.gate == "linear":
                g, sg, _ = proj("phi", c, tok)
            elif cfg.gate == "tanh":
                g = np.tanh(tok)
                sg = config.ELEMENTARY_FUNCTION_ULPS * (np.abs(g) + eu)
            elif cfg.gate == "identity":
                g, sg = tok, np.zeros_like(tok)
            else:
                g = sg = None
        q, k, v = p[..., :c], p[..., c:2 * c], p[..., 2 * c:3 * c]
        sq, sk, sv = sp_[..., :c], sp_[..., c:2 * c], sp_[..., 2 * c:3 * c]
        spl = lambda a: _split_heads(a, cfg.num_heads)
        y = _merge_heads(rala_core(spl(q), spl(k), spl(v), cfg, (h, w)))
        shared = _merge_heads(_core_sigma(spl(q), spl(sq), spl(k), spl(sk), spl(v), spl(sv), cfg, (h, w), pr))
        own_sq, vpart = np.zeros_like(y), np.zeros_like(y)
        if cfg.lepe_kernel:
            to_tok = lambda a: a.reshape(a.shape[0], c, h * w).transpose(0, 2, 1)
            wl, bl, pad = _param(params, "lepe.weight"), bias("lepe.bias"), cfg.lepe_kernel // 2
            v_cf, sv_cf = _tokens_to_cf(v, h, w), _tokens_to_cf(sv, h, w)
            lepe = to_tok(layers.depthwise_conv2d(v_cf, wl, bl, padding=pad))
            mag = to_tok(layers.depthwise_conv2d(np.abs(v_cf), np.abs(wl), None if bl is None else np.abs(bl),
                                                 padding=pad))
            vpart = to_tok(np.sqrt(layers.depthwise_conv2d(sv_cf * sv_cf, wl * wl, None, padding=pad)))
            y = y + lepe
            own_sq = _sum_own_sq(cfg.lepe_kernel ** 2, mag, lepe, bl, pr) + (np.abs(y) + eu) ** 2
        if g is not None:
            shared, vpart = np.abs(g) * shared, np.abs(g) * vpart
            own_sq = g * g * own_sq + (np.abs(y) * sg) ** 2 + (np.abs(g * y) + eu) ** 2
            y = g * y
        if cfg.out_proj:
            out, s_own, wt = proj("proj", c, y)
            return np.sqrt((shared @ np.abs(wt).T + np.sqrt((vpart * vpart) @ (wt * wt).T)) ** 2
                           + own_sq @ (wt * wt).T + s_own ** 2)
    return np.sqrt((shared + vpart) ** 2 + own_sq)


def _as_bound(e: np.ndarray, depth: float, pr: _Prec, note: str, sigma: Any = None,
              e_ref: Any = None) -> numerics.Bound:
    """Bound(E / gamma_K, K): gamma_K(u_T) scale = E.  With mixed-precision counts (:meth:`_Prec.sums`) every
    count c is at least c u_A / u_T, so K u_T / u_A bounds the float64 reference's own count (ref_depth).
    ``sigma``: the l2 coefficient (units of u_T; :func:`_core_sigma`), capped at E / u_T (E bounds the l1 norm
    of the first-order coefficients, hence their l2 norm); E / u_T stands in where sigma is not finite.
    ``e_ref``: the same E evaluated in float64, the reference's own error, used (Bound.ref_scale) where E in T is
    not finite (there E / gamma_K is no scale for the reference's error)."""
    ratio = numerics.accumulation_ratio(pr.dtype)
    ref_depth = depth / ratio if ratio < 1.0 else None
    ref_scale = None
    if e_ref is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            g_t = pr.g(depth)
            own = e / g_t if math.isfinite(g_t) else np.full_like(e, np.inf)
            ref_scale = np.where(np.isfinite(own), own,
                                 e_ref / numerics.gamma(depth if ref_depth is None else ref_depth,
                                                        numerics.unit_roundoff("float64")))
    if sigma is not None:
        cap = np.asarray(e, dtype=np.float64) / pr.u
        with np.errstate(invalid="ignore"):
            sigma = np.where(np.isfinite(sigma), np.fmin(sigma, cap), cap)
    g = pr.g(depth)
    if not math.isfinite(g):  # K u >= 1: no bound of this form exists (inf, not E / inf = 0 and 0 * inf = NaN)
        return numerics.Bound(np.full_like(e, np.inf), depth, note + f"; gamma_K is infinite (K = {depth}): no bound",
                              sigma=sigma, ref_depth=ref_depth, ref_scale=ref_scale)
    mixed = (f"; sums accumulated in {config.ACCUMULATION_FORMAT[pr.dtype]} and counted as n u_A/u_T + 1"
             if ratio < 1.0 else "")
    return numerics.Bound(e / g, depth,
                          note + mixed + "; scale = E / gamma_K so that gamma_K * scale = E (rigorous up to the "
                                         "libm accuracy assumption)",
                          ref_depth=ref_depth, sigma=sigma, ref_scale=ref_scale)


def rala_core_bound(q: Any, k: Any, v: Any, cfg: RALAConfig, hw: tuple[int, int] | None = None, *,
                    dtype: Any) -> numerics.Bound:
    """Error bound of :func:`rala_core` computed in precision ``dtype`` on the same (T-exact) inputs.

    Parameters: q, k, v (B, h, N, d), cfg, hw as :func:`rala_core`; dtype : the tested precision T.
    Returns numerics.Bound with scale (B, h, N, d) and the l2 coefficient sigma (:func:`_core_sigma`);
    derivation in the module's "Error model" section.  Valid for both orders and for the stage orders of the
    PyTorch twin (official: 1/(den + eps) then a product; k * softmax * N).

    References: RALA Eq. 2-4, 6; Higham (2002) eq. 2.8, Lemma 3.1, eq. 3.12; docs/design.md "The verdict".
    """
    validation.check_config(cfg, RALAConfig)
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h N d"), v=(v, "B h N d"))
    if hw is not None:
        hw = validation.check_grid(hw, sz["N"], tokens="q")
    pr = _Prec.of(dtype)
    z = np.zeros_like(q)
    e, depth = _core_error(q, z, k, z, v, z, cfg, hw, pr)
    e64 = None
    if not (np.all(np.isfinite(e)) and math.isfinite(pr.g(depth))):    # the reference's own error, finite
        e64 = _core_error(q, z, k, z, v, z, cfg, hw, _Prec.of("float64"))[0]
    return _as_bound(e, depth, pr, f"rala_core (exact inputs): running error bound, depth K = {depth:.4g}; l2 "
                                   f"coefficient sigma (_core_sigma)", sigma=_core_sigma(q, z, k, z, v, z, cfg, hw, pr),
                     e_ref=e64)


def rala_attention_bound(x: Any, params: Mapping[str, Any], cfg: RALAConfig, *, dtype: Any) -> numerics.Bound:
    """Error bound of :func:`rala_attention` computed in precision ``dtype`` on the same (T-exact) x and
    parameters: projections (gamma_{C+1}), the core with its inputs' errors, LePE (gamma_{k^2+1} plus the
    propagated error of V), the addition, the gate product (phi's own error: gamma_{C+1} linear, c u
    |tanh| for tanh) and the output projection.  Returns Bound with the output's shape and layout, carrying the
    l2 coefficient sigma (:func:`_attention_sigma`; the verdict uses min(E, lam u sigma)) and, where E is
    infinite in T, the float64 reference's own error (Bound.ref_scale).

    References: RALA Eq. 2-4, 6; Higham (2002) eq. 3.12; docs/design.md "The verdict".
    """
    validation.check_config(cfg, RALAConfig)
    x = _check_grid(x, cfg.layout, cfg.dim)
    _check_params(params, rala_param_shapes(cfg), "rala_attention_bound")
    pr = _Prec.of(dtype)
    tok, h, w = _grid_to_tokens(x, cfg.layout)
    ey, depth = _attention_e(tok, params, cfg, (h, w), pr)
    e = _tokens_to_grid(ey, h, w, cfg.layout)
    e64 = None
    if not (np.all(np.isfinite(e)) and math.isfinite(pr.g(depth))):    # the reference's own error, finite
        e64 = _tokens_to_grid(_attention_e(tok, params, cfg, (h, w), _Prec.of("float64"))[0], h, w, cfg.layout)
    return _as_bound(e, depth, pr,
                     f"rala_attention: running error bound through projections, core, LePE, gate and projection, "
                     f"depth K = {depth:.4g}; l2 coefficient sigma (_attention_sigma)",
                     sigma=_tokens_to_grid(_attention_sigma(tok, params, cfg, (h, w), pr), h, w, cfg.layout),
                     e_ref=e64)


def _attention_e(tok: np.ndarray, params: Mapping[str, Any], cfg: RALAConfig, hw: tuple[int, int],
                 pr: _Prec) -> tuple[np.ndarray, float]:
    """(E (tokens (B, N, C), absolute), K) of :func:`rala_attention` in precision pr on exact tokens."""
    c, (h, w) = cfg.dim, hw
    q, k, v, g = _projections(tok, params, cfg)
    zero = np.zeros_like(tok)
    bias = lambda key: None if params.get(key) is None else numerics.as_float(params[key], key)
    if cfg.gate_source == "qkvo":
        wt = _weight2d(params["qkvo.weight"], cfg.layout, "qkvo.weight", 4 * c, c)
        e_all = _e_linear(tok, zero, wt, bias("qkvo.bias"), pr)
        eq, ek, ev, eg = e_all[..., :c], e_all[..., c:2 * c], e_all[..., 2 * c:3 * c], e_all[..., 3 * c:]
    else:
        wt = _weight2d(params["qkv.weight"], cfg.layout, "qkv.weight", 3 * c, c)
        e_all = _e_linear(tok, zero, wt, bias("qkv.bias"), pr)
        eq, ek, ev = e_all[..., :c], e_all[..., c:2 * c], e_all[..., 2 * c:]
        if cfg.gate == "linear":
            eg = _e_linear(tok, zero, _weight2d(params["phi.weight"], cfg.layout, "phi.weight", c, c),
                           bias("phi.bias"), pr)
        elif cfg.gate == "tanh":
            eg = config.ELEMENTARY_FUNCTION_ULPS * (pr.u * np.abs(g) + pr.eta)
        elif cfg.gate == "identity":
            eg = zero
        else:
            eg = None
    sp = lambda a: _split_heads(a, cfg.num_heads)
    e_core, depth = _core_error(sp(q), sp(eq), sp(k), sp(ek), sp(v), sp(ev), cfg, (h, w), pr)
    y = _merge_heads(rala_core(sp(q), sp(k), sp(v), cfg, (h, w)))
    ey = _merge_heads(e_core)
    depth += pr.sums(c) + 1
    if cfg.lepe_kernel:
        to_tok = lambda a: a.reshape(a.shape[0], c, h * w).transpose(0, 2, 1)
        wl, bl = _param(params, "lepe.weight"), bias("lepe.bias")
        lepe = to_tok(layers.depthwise_conv2d(_tokens_to_cf(v, h, w), wl, bl, padding=cfg.lepe_kernel // 2))
        el = to_tok(_e_depthwise(_tokens_to_cf(v, h, w), _tokens_to_cf(ev, h, w), wl, bl, pr))
        ey = _e_sum2(y, ey, lepe, el, pr)
        y = y + lepe
        depth = max(depth, pr.sums(cfg.lepe_kernel ** 2) + 1 + pr.sums(c) + 1) + 1
    if g is not None:
        ey = _e_product(y, ey, g, eg, pr)
        y = g * y
        depth += 1
    if cfg.out_proj:
        ey = _e_linear(y, ey, _weight2d(params["proj.weight"], cfg.layout, "proj.weight", c, c), bias("proj.bias"), pr)
        depth += pr.sums(c) + 1
    return ey, depth


def rala_attention_stages(params: Mapping[str, Any], cfg: RALAConfig, hw: tuple[int, int], *,
                          fine: bool = False) -> list[numerics.Stage]:
    """The stages of :func:`rala_attention`, for :func:`refimpl.verdict.compare_stages`.

    Tensors (in the layout of x, ``cfg.layout``): "x"; "proj_in" (B, mC, ...) the fused projection's output
    (qkv, or qkvo with the gate's rows: the output of the twin's ``qkv`` / ``qkvo`` submodule); with gate
    "linear" from its own projection, "phi" (B, C, ...); "core" (B, C, ...), the reweighted attention of
    Eq. 2-4 with heads merged; with LePE, "lepe" (B, C, ...) the depthwise conv of V; "gated" (B, C, ...),
    (core + lepe) * gate (Eq. 6; the output projection's input); with ``out_proj``, "out".  Heads are split
    as the twin splits them (channel h d + e of each of Q, K, V).  ``fine``: the core is cut into "alpha"
    (B, h, N), Eq. 4's weights; "k_weighted" (B, h, N, d), alpha_j kappa(K_j); "numerator" (B, h, N, d) and
    "denominator" (B, h, N) of Eq. 2-3 (RoPE and the token scaling inside); and "core", their quotient with heads
    merged.  The whole core's bound carries alpha's softmax error through both contractions; cut there, each
    stage is judged against its own bound.

    References
    ----------
    RALA Eq. 2-4, 6, §3.2; docs/design.md "Stages".
    """
    c, (h, w), lay, nh = cfg.dim, validation.check_grid(hw), cfg.layout, cfg.num_heads
    _check_params(params, rala_param_shapes(cfg), "rala_attention_stages")
    key = "qkvo" if cfg.gate_source == "qkvo" else "qkv"
    rows = 4 * c if key == "qkvo" else 3 * c

    def bias(name):
        return None if params.get(name) is None else numerics.as_float(params[name], name)

    def tokens(t):
        return _grid_to_tokens(t, lay)[0]

    def grid(t):
        return _tokens_to_grid(t, h, w, lay)

    def lin_stage(name, source, wkey, out):
        wt, bt = _weight2d(_param(params, wkey + ".weight"), lay, wkey + ".weight", out, c), bias(wkey + ".bias")

        def bound(t, dtype=None):
            b = layers.linear_bound(tokens(t), wt, bt)
            return numerics.Bound(grid(np.asarray(b.scale)), b.k, b.note, accumulation=True)

        return numerics.Stage(name, (source,), lambda t: grid(layers.linear(tokens(t), wt, bt)), bound,
                              f"RALA: the {wkey} projection (1 x 1 conv channels-first)")

    def qkv_heads(p):
        t = tokens(p)
        return tuple(_split_heads(t[..., i * c:(i + 1) * c], nh) for i in range(3))

    def core(p):
        return grid(_merge_heads(rala_core(*qkv_heads(p), cfg, hw)))

    def core_bound(p, dtype=None):
        b = rala_core_bound(*qkv_heads(p), cfg, hw, dtype=dtype)
        return numerics.Bound(grid(_merge_heads(np.asarray(b.scale))), b.k, b.note, ref_depth=b.ref_depth,
                              sigma=grid(_merge_heads(np.asarray(b.sigma))),
                              ref_scale=None if b.ref_scale is None else grid(_merge_heads(np.asarray(b.ref_scale))))

    stages = [lin_stage("proj_in", "x", key, rows)]
    if key == "qkv" and cfg.gate == "linear":
        stages.append(lin_stage("phi", "x", "phi", c))
    if fine:
        stages += _rala_core_stages(cfg, hw, qkv_heads, grid)
    else:
        stages.append(numerics.Stage("core", ("proj_in",), core, core_bound,
                                     "RALA Eq. 2-4: the reweighted attention"))
    gated_inputs = ["core"]
    if cfg.lepe_kernel:
        wl, bl, pad = _param(params, "lepe.weight"), bias("lepe.bias"), cfg.lepe_kernel // 2

        def v_grid(p):
            return _tokens_to_cf(tokens(p)[..., 2 * c:3 * c], h, w)

        def from_cf(t):
            return grid(t.reshape(t.shape[0], c, h * w).transpose(0, 2, 1))

        def lepe_bound(p, dtype=None):
            b = layers.depthwise_conv2d_bound(v_grid(p), wl, bl, padding=pad)
            return numerics.Bound(from_cf(np.asarray(b.scale)), b.k, b.note, accumulation=True)

        stages.append(numerics.Stage("lepe", ("proj_in",),
                                     lambda p: from_cf(layers.depthwise_conv2d(v_grid(p), wl, bl, padding=pad)),
                                     lepe_bound, "RALA §3.2: LePE, a depthwise conv of V"))
        gated_inputs.append("lepe")
    gate_source = {"qkvo": "proj_in", "linear": "phi", "identity": "x", "tanh": "x"}.get(
        "qkvo" if key == "qkvo" else cfg.gate)
    if gate_source is not None:
        gated_inputs.append(gate_source)

    def gate_of(src):
        if key == "qkvo":
            return grid(tokens(src)[..., 3 * c:])
        return np.tanh(src) if cfg.gate == "tanh" else src

    def gated(*t):
        y = t[0] + (t[1] if cfg.lepe_kernel else 0.0)
        return y * gate_of(t[-1]) if gate_source is not None else y

    def gated_bound(*t, dtype=None):
        # the sum with LePE and the product with the gate: two roundings on |core| + |lepe| times |gate|;
        # tanh's own c ulps enter as c more roundings of the product
        mag = np.abs(t[0]) + (np.abs(t[1]) if cfg.lepe_kernel else 0.0)
        if gate_source is None:
            return numerics.Bound(mag, 1.0 if cfg.lepe_kernel else 0.0, "core (+ LePE): one addition")
        k = (2.0 if cfg.lepe_kernel else 1.0) + (config.ELEMENTARY_FUNCTION_ULPS if cfg.gate == "tanh" else 0.0)
        return numerics.Bound(mag * np.abs(gate_of(t[-1])), k, "(core + LePE) * gate: the sum and the product")

    stages.append(numerics.Stage("gated", tuple(gated_inputs), gated, gated_bound,
                                 "RALA Eq. 6: (RALA(X) + LePE(V)) * phi(X)"))
    if cfg.out_proj:
        stages.append(lin_stage("out", "gated", "proj", c))
    return stages


def _rala_core_stages(cfg: RALAConfig, hw: tuple[int, int], qkv_heads, grid) -> list[numerics.Stage]:
    """The fine stages of the core (:func:`rala_attention_stages` with ``fine=True``)."""
    n = hw[0] * hw[1]
    z = np.zeros_like

    def kappas(p):
        q, k, v = qkv_heads(p)
        return q, kappa(q, cfg.kernel), kappa(k, cfg.kernel), k, v

    def scores(p):
        q, kq, kk, _, _ = kappas(p)
        q_g, scale, _ = _reweighting(q, kq, kk, cfg)
        return scale * (q_g @ kk.swapaxes(-1, -2))[..., 0, :]

    def scores_bound(p, dtype=None):
        pr = _Prec.of(dtype)
        q, kq, kk, k, _ = kappas(p)
        _, e, depth = _scores_error(q, z(q), kq, _e_kappa(q, z(q), cfg.kernel, pr), kk,
                                    _e_kappa(k, z(k), cfg.kernel, pr), cfg, pr)
        return _as_bound(e, depth + config.ELEMENTARY_FUNCTION_ULPS + 1, pr, "Eq. 4's logits on exact Q, K")

    def alpha(s):
        return s.shape[-1] * numerics.softmax(s, axis=-1)

    def alpha_bound(s, dtype=None):
        pr = _Prec.of(dtype)
        _, e, depth = _softmax_alpha_error(s, z(s), pr)
        return _as_bound(e, depth, pr, "Eq. 4's alpha = N softmax(s) on exact logits")

    def k_weighted(p, a):
        return a[..., None] * kappas(p)[2]

    def k_weighted_bound(p, a, dtype=None):
        # kappa(K)'s own error times alpha, and three roundings: the tested code may form (kappa(K) softmax) N
        # (the released code's order) while its alpha is fl(softmax N), a rounding away from the one the product
        # saw; kappa(K) softmax, of size 1/N, may fall below T's normal range (float16 at N = 3136): an absolute
        # eta_T there, times N
        pr = _Prec.of(dtype)
        _, _, kk, k, _ = kappas(p)
        e = _e_kappa(k, z(k), cfg.kernel, pr) * np.abs(a[..., None]) + pr.g(3) * np.abs(a[..., None] * kk) \
            + (n + 2) * pr.eta
        return _as_bound(e, config.ELEMENTARY_FUNCTION_ULPS + 4, pr, "alpha_j kappa(K_j) on exact alpha, K")

    def parts(p, kw, dtype):
        pr = _Prec.of(dtype)
        q, kq, _, _, v = kappas(p)
        return _attention_parts_error(kq, _e_kappa(q, z(q), cfg.kernel, pr), kw, z(kw), v, z(v), cfg, hw, pr), pr

    def numerator(p, kw):
        _, kq, _, _, v = kappas(p)
        return _numerator_denominator(kq, kw, v, cfg, hw)[0]

    def denominator(p, kw):
        _, kq, _, _, v = kappas(p)
        den = _numerator_denominator(kq, kw, v, cfg, hw)[1]
        return den + cfg.eps if cfg.eps else den

    def numerator_bound(p, kw, dtype=None):
        (_, enum, _, _, depth), pr = parts(p, kw, dtype)
        return _as_bound(enum, depth + config.ELEMENTARY_FUNCTION_ULPS + 1, pr,
                         "Eq. 2-3's numerator (RoPE, token scaling) on exact kappa(Q), weighted keys, V")

    def denominator_bound(p, kw, dtype=None):
        (_, _, _, eden, depth), pr = parts(p, kw, dtype)
        return _as_bound(eden, depth + config.ELEMENTARY_FUNCTION_ULPS + 1, pr,
                         "Eq. 2's normaliser on exact kappa(Q), weighted keys")

    def merge(t):
        return grid(_merge_heads(t))

    def quotient(num, den):
        with np.errstate(invalid="ignore", divide="ignore"):
            return merge(num / den[..., None])

    def quotient_bound(num, den, dtype=None):
        with np.errstate(invalid="ignore", divide="ignore"):
            return numerics.Bound(merge(np.abs(num / den[..., None])), 2.0,
                                  "numerator / denominator: a quotient, or a reciprocal and a product")

    reweighting = [
        numerics.Stage("scores", ("proj_in",), scores, scores_bound, "RALA Eq. 4: s = d^-1/2 q_g kappa(K)^T"),
        numerics.Stage("alpha", ("scores",), alpha, alpha_bound, "RALA Eq. 4: alpha = N softmax(s)"),
    ]
    if not cfg.reweight:                     # alpha = 1: the weighted keys are kappa(K) itself
        reweighting = [numerics.Stage("alpha", ("proj_in",), lambda p: np.ones(qkv_heads(p)[0].shape[:-1]),
                                      lambda p, dtype=None: numerics.Bound(np.zeros(1), 1.0, "alpha = 1: exact"),
                                      "RALA without reweighting: alpha = 1")]
    return reweighting + [
        numerics.Stage("k_weighted", ("proj_in", "alpha"), k_weighted, k_weighted_bound,
                       "RALA Eq. 2-3: alpha_j kappa(K_j)"),
        numerics.Stage("numerator", ("proj_in", "k_weighted"), numerator, numerator_bound,
                       "RALA Eq. 3 (RoPE, the released code's token scaling): kappa(Q) sum_j alpha_j kappa(K_j)^T V_j"),
        numerics.Stage("denominator", ("proj_in", "k_weighted"), denominator, denominator_bound,
                       "RALA Eq. 2: kappa(Q) sum_j alpha_j kappa(K_j)^T (+ eps)"),
        numerics.Stage("core", ("numerator", "denominator"), quotient, quotient_bound,
                       "RALA Eq. 2: the quotient"),
    ]


def ravlt_ffn_bound(x: Any, params: Mapping[str, Any], cfg: RAVLTBlockConfig, *, dtype: Any) -> numerics.Bound:
    """Error bound of :func:`ravlt_ffn` in precision ``dtype`` (exact x): fc1 (gamma_{C+1}); GELU (error of
    its input times config.GELU_LIPSCHITZ, plus its own gamma_k |h| of layers.gelu_bound); the depthwise
    conv residual (gamma_{10} on the convolution of magnitudes, plus the propagated error, plus the sum);
    fc2 with its input's error.  Returns Bound with x's shape.

    References: RALA §3.2; Higham (2002) eq. 3.12.
    """
    validation.check_config(cfg, RAVLTBlockConfig)
    layout, c, hd = cfg.attn.layout, cfg.attn.dim, cfg.hidden
    x = _check_grid(x, layout, c)
    _check_params(params, _ffn_shapes(cfg), "ravlt_ffn_bound")
    pr = _Prec.of(dtype)
    tok, h, w = _grid_to_tokens(x, layout)
    bias = lambda key: None if params.get(key) is None else numerics.as_float(params[key], key)
    w1 = _weight2d(_param(params, "fc1.weight"), layout, "fc1.weight", hd, c)
    pre = layers.linear(tok, w1, bias("fc1.bias"))
    e1 = _e_linear(tok, np.zeros_like(tok), w1, bias("fc1.bias"), pr)
    hid = numerics.gelu(pre)
    gb = layers.gelu_bound(pre)
    eh = config.GELU_LIPSCHITZ * e1 + pr.g(gb.k) * np.asarray(gb.scale) + gb.k * pr.eta
    depth = c + 1 + gb.k
    if cfg.ffn_dwconv:
        to_tok = lambda a: a.reshape(a.shape[0], hd, h * w).transpose(0, 2, 1)
        wd, bd = _param(params, "dwconv.weight"), bias("dwconv.bias")
        conv = to_tok(layers.depthwise_conv2d(_tokens_to_cf(hid, h, w), wd, bd, padding=1))
        ec = to_tok(_e_depthwise(_tokens_to_cf(hid, h, w), _tokens_to_cf(eh, h, w), wd, bd, pr))
        eh = _e_sum2(hid, eh, conv, ec, pr)
        hid = hid + conv
        depth += 11
    w2 = _weight2d(_param(params, "fc2.weight"), layout, "fc2.weight", c, hd)
    e2 = _e_linear(hid, eh, w2, bias("fc2.bias"), pr)
    depth += hd + 1
    return _as_bound(_tokens_to_grid(e2, h, w, layout), depth, pr,
                     f"ravlt_ffn: running error bound (fc1, GELU, {'dwconv, ' if cfg.ffn_dwconv else ''}fc2), "
                     f"depth K = {depth}; GELU's Lipschitz constant config.GELU_LIPSCHITZ")


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def residual_bound(a: Any, b: Any, gamma: Any = None) -> numerics.Bound:
    """a + b, or a + gamma (.) b (layerscale), of exact operands: one or two roundings on |a| + |gamma||b|
    (|fl(a + fl(g b)) - (a + g b)| <= gamma_2 (|a| + |g b|))."""
    a, b = numerics.as_float(a, "a"), numerics.as_float(b, "b")
    if a.shape != b.shape:
        raise ArgumentError(f"arguments 'a', 'b': expected the same shape, got {a.shape} and {b.shape}")
    if gamma is not None and not _broadcasts_to(numerics.as_float(gamma, "gamma").shape, b.shape):
        raise ArgumentError(f"argument 'gamma': expected a shape that broadcasts against b {b.shape} (per-channel "
                            f"layerscale), got {np.shape(gamma)}")
    if gamma is None:
        return numerics.Bound(np.abs(a) + np.abs(b), 1, "residual addition: one rounding")
    return numerics.Bound(np.abs(a) + np.abs(numerics.as_float(gamma, "gamma") * b), 2,
                          "layerscale product and residual addition: two roundings")
