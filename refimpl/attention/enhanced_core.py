"""L2ViT's enhanced linear attention: the configuration of the modules and blocks (:class:`L2ViTConfig`), the
attention core (Eq. 4 with the clamp of Appendix 8 and the learnable scale of §4.2; both association orders)
and its error bound (:func:`enhanced_linear_attention_bound`, with ``_err_core`` and ``_bound``).

Reference: Zheng, "The Linear Attention Resurrection in Vision Transformer" (../shared/seeds/000_115736258caa34b1.txt),
§4.2, Eq. 4, Appendix 7-8.  Equation numbers are the paper's; the reading of the scale s, the presets and the
blocks are stated in :mod:`refimpl.attention.enhanced`.

Shapes: B batch, N tokens, C channels, h heads, d = C / h head dim; per-head tensors (B, h, N, d).

Layer: attention, the bottom of L2ViT's two files: imports config, numerics, validation, backends, :mod:`.linear`
and :mod:`.focused_bounds` (the propagation helpers), nothing from :mod:`.enhanced`, which imports it (the
attention module, LCM, the LGA / LWA blocks, parameter shapes, their bounds and stages) and re-exports its
public names (their documented home).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .. import backends, config, numerics, validation
from ..errors import ArgumentError
from ..validation import check_attention_order as _check_order
from .focused_bounds import err_attention, relu_error
from .linear import kernelized_attention

__all__ = ["L2ViTConfig", "enhanced_linear_attention", "enhanced_linear_attention_bound"]


# ===================================================================================================
# Configuration and presets
# ===================================================================================================

@dataclasses.dataclass(frozen=True)
class L2ViTConfig:
    """Configuration of L2ViT's blocks (L2ViT §4.3, Appendix 12, Table 13).

    Attributes
    ----------
    dim : int, C.  num_heads : int, h (C % h == 0).
    window_size : LWA window (Table 13: 7).  lcm_kernel : odd LCM kernel (7; 3 allowed).
    cpe_kernel : odd CPE kernel (3).  c_min : the normaliser clamp C_min (Appendix 8: 1e2).
    mlp_ratio : MLP expansion (4).  qkv_bias : bool.  layer_norm_eps, batch_norm_eps : PyTorch defaults.
    scale_mode : "scalar" (paper: O / s, "attn.scale" (1,)) or "per_head" (released: O * t_h,
        "attn.temperature" (h, 1, 1)).
    scale_target : "numerator" (s scales K^T V only; both presets) or "similarity" (s scales phi(Q) phi(K)^T,
        i.e. numerator and clamped denominator).
    lcm_placement : "residual" (Eq. 8: X + LCM(LN_3 X) after the attention residual; both presets) or
        "attention" (LCM applied to the attention output inside its residual, X + LCM(Attn(LN_1 X)), the
        Eq. 5 reading; no norm3).
    lwa_cpe : "once" (paper) or "twice" (released LWA: a second CPE "cpe.1" before the MLP).
    window_rel_pos_bias, window_shift, window_mask_padding : LWA's window-attention options
        (:func:`refimpl.attention.softmax.window_attention`).
    """

    dim: int
    num_heads: int
    window_size: int = config.L2VIT_WINDOW
    lcm_kernel: int = config.L2VIT_LCM_KERNEL
    cpe_kernel: int = config.L2VIT_CPE_KERNEL
    c_min: float = config.L2VIT_C_MIN
    mlp_ratio: float = config.L2VIT_MLP_RATIO
    qkv_bias: bool = True
    layer_norm_eps: float = config.LAYER_NORM_EPS
    batch_norm_eps: float = config.BATCH_NORM_EPS
    scale_mode: str = "scalar"
    scale_target: str = "numerator"
    lcm_placement: str = "residual"
    lwa_cpe: str = "once"
    window_rel_pos_bias: bool = False
    window_shift: int = 0
    window_mask_padding: bool = True

    def __post_init__(self) -> None:
        """Raises ArgumentError / ArgumentTypeError for dim, num_heads not integers >= 1 with C % h == 0, a window
        size < 1, an even LCM or CPE kernel, a window shift outside [0, window_size), c_min < 0, mlp_ratio <= 0 or an
        MLP width int(C mlp_ratio) < 1, a norm eps that is not finite and >= 0, and an option outside its choices."""
        validation.check_heads(self.dim, self.num_heads)
        numerics.check_positive_int(self.window_size, "window_size")
        for name in ("lcm_kernel", "cpe_kernel"):
            k = numerics.check_positive_int(getattr(self, name), name)
            if k % 2 == 0:
                raise ArgumentError(f"argument '{name}': expected an odd kernel size ('same' padding), got {k}")
        numerics.check_positive_int(self.window_shift, "window_shift", minimum=0)
        if self.window_shift >= self.window_size:
            raise ArgumentError(f"argument 'window_shift': expected 0 <= shift < window_size={self.window_size}, "
                             f"got {self.window_shift}")
        validation.check_real(self.c_min, "c_min", minimum=0.0)
        validation.check_positive(self.mlp_ratio, "mlp_ratio")
        if self.mlp_hidden < 1:
            raise ArgumentError(f"argument 'mlp_ratio': the MLP width int(dim * mlp_ratio) must be >= 1, got "
                                f"int({self.dim} * {self.mlp_ratio}) = {self.mlp_hidden}")
        validation.check_eps(self.layer_norm_eps, "layer_norm_eps")
        validation.check_eps(self.batch_norm_eps, "batch_norm_eps")
        validation.check_config_options(self, {"scale_mode": ("scalar", "per_head"),
                                               "scale_target": ("numerator", "similarity"),
                                               "lcm_placement": ("residual", "attention"), "lwa_cpe": ("once", "twice")})

    @property
    def head_dim(self) -> int:
        """d = C / h, the head dimension."""
        return self.dim // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        """The MLP's hidden width int(C mlp_ratio)."""
        return int(self.dim * self.mlp_ratio)

    @classmethod
    def preset(cls, name: str = "paper", **overrides: Any) -> "L2ViTConfig":
        """``"paper"``: §4 and the appendix as written.  ``"official"``: per-head temperature (init d^-1/2)
        multiplying the numerator, a second CPE in LWA blocks, padded tokens unmasked in LWA.  ``overrides``
        set any field (``dim`` and ``num_heads`` required)."""
        if name == "paper":
            fields: dict[str, Any] = {}
        elif name == "official":
            fields = dict(scale_mode="per_head", lwa_cpe="twice", window_mask_padding=False)
        else:
            raise ArgumentError(f"argument 'name': expected 'paper' or 'official', got {name!r}")
        fields.update(overrides)
        return cls(**fields)


# ===================================================================================================
# The attention core (Eq. 4 with the clamp of Appendix 8 and the scale of §4.2)
# ===================================================================================================

def _scaled(a: np.ndarray, scale: Any, scale_mode: str, h: int) -> tuple[np.ndarray, np.ndarray]:
    """(a / s or a * s, |gain|): the learnable scale applied to an operand (B, h, ., .), per head or
    scalar; the gain t (1, h, 1, 1) is 1 / s ("divide", the paper's s) or s ("multiply", the temperature)."""
    s = numerics.as_float(scale, "scale")
    if s.size not in (1, h):
        raise ArgumentError(f"argument 'scale': expected one value or one per head ({h}), got shape {s.shape}")
    s = s.reshape(1, -1, 1, 1)
    if scale_mode == "divide":
        return a / s, 1.0 / s
    if scale_mode == "multiply":
        return a * s, s
    raise ArgumentError(f"argument 'scale_mode': expected 'divide' or 'multiply', got {scale_mode!r}")


def enhanced_linear_attention(q: Any, k: Any, v: Any, *, c_min: float = config.L2VIT_C_MIN, scale: Any = 1.0,
                              scale_mode: str = "divide", scale_target: str = "numerator",
                              order: str = "linear", taps: dict | None = None,
                              max_elements: int | None = None) -> np.ndarray:
    """ReLU linear attention with the clamped normaliser and the learnable scale (L2ViT Eq. 4, §4.2, App. 8).

        O_i = t phi(Q_i) (phi(K)^T V) / max(phi(Q_i) . sum_j phi(K_j), C_min)           (scale_target="numerator")
        O_i = t phi(Q_i) (phi(K)^T V) / max(t phi(Q_i) . sum_j phi(K_j), C_min)         (scale_target="similarity")

    with phi = ReLU and t = 1 / s (``scale_mode="divide"``, the paper's s) or t = s ("multiply", the released
    per-head temperature).  Wherever phi(Q_i) . sum phi(K) >= C_min the clamp is inactive and the output equals
    the unclamped Eq. (4) bit for bit (np.maximum returns its first argument); a dead query (phi(Q_i) = 0) gives
    0, not 0/0.  A per-head t commutes into V (numerator) or phi(K) (similarity); that is how it is applied.

    Backends: with scale_target="numerator" (both presets, scalar s or per-head temperature), order="linear",
    no taps, one float32/float64 working dtype and a selected backend other than NumPy
    (:func:`refimpl.backends.use`; ``backends.call``, the kernel's predicate decides), the core runs as
    operation "linear_attention" (the fused C kernel) on
    (q, k, t V) with ReLU, eps = 0 and clamp_min = C_min: the same function of the same rounded operands,
    within :func:`enhanced_linear_attention_bound`.  The C kernel applies s itself (``v_scale=``: V / s or
    V * s rounded once per element as it loads the V rows), so t V is never stored.  scale_target="similarity" always runs on NumPy (t sits
    inside the clamped normaliser, which the kernel does not have).

    Parameters
    ----------
    q : float array (B, h, N, d).  k : (B, h, M, d).  v : (B, h, M, e).
    c_min : float >= 0, C_min (0 disables the clamp: a dead query then gives 0/0 = NaN).
    scale : float or float array of 1 or h values (per head).  scale_mode : "divide" or "multiply".
    scale_target : "numerator" or "similarity".
    order : "linear" (phi(K)^T V first) or "quadratic" (N x M matrix; guarded by ``max_elements``).
    taps : dict or None; :func:`refimpl.attention.linear.kernelized_attention`'s names ("phi_q", "phi_k",
        "kv", "k_sum", "scores", "numerator", "denominator_raw", "denominator" (clamped), "attn") plus
        "gain" (1, h, 1, 1).  With scale_target="numerator", "kv" already includes t.

    Returns
    -------
    ndarray (B, h, N, e), working precision.

    References
    ----------
    L2ViT Eq. 2-4, §4.1 (ReLU), §4.2 (clamp and scale s), Appendix 7 (s = sqrt(C)), Appendix 8 (C_min, Table 10).
    """
    validation.check_max_elements(max_elements)
    validation.check_real(c_min, "c_min", minimum=0.0)
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h M d"), v=(v, "B h M e"))
    _check_order(order)
    if scale_target == "numerator" and order == "linear" and taps is None:
        # Exactly the fused kernel's computation (operation "linear_attention"): ReLU feature maps, the gain t
        # folded into V (the same rounded v_eff = V / s or V * s as below), eps 0, den -> max(den, C_min).
        # First with the gain as ``v_scale=`` (the C kernel divides (multiplies) each V element by its head's
        # s as it stages the V rows: one rounded operation on the same operands as v_eff, without the
        # (B, h, M, e) temporary), which the C kernel's predicate takes for one float32/float64 dtype and 1 or
        # h gains; otherwise on the prescaled v_eff; otherwise (and on the default NumPy backend) the NumPy
        # path below, whose results are unchanged.
        args = ("relu", config.LINEAR_DEFAULT_EPS, "add", c_min)

        def prescaled() -> np.ndarray:
            v_eff, _ = _scaled(v, scale, scale_mode, sz["h"])
            return backends.call("linear_attention", q, k, v_eff, *args, otherwise=lambda: kernelized_attention(
                numerics.relu(q), numerics.relu(k), v_eff, order=order, clamp_min=c_min, max_elements=max_elements))

        return backends.call("linear_attention", q, k, v, *args, v_scale=numerics.as_float(scale, "scale"),
                             v_scale_mode=scale_mode, otherwise=prescaled)
    phi_q, phi_k = numerics.relu(q), numerics.relu(k)
    if scale_target == "numerator":
        v_eff, t = _scaled(v, scale, scale_mode, sz["h"])
        out = kernelized_attention(phi_q, phi_k, v_eff, order=order, clamp_min=c_min, taps=taps,
                                   max_elements=max_elements)
    elif scale_target == "similarity":
        pk, t = _scaled(phi_k, scale, scale_mode, sz["h"])
        out = kernelized_attention(phi_q, pk, v, order=order, clamp_min=c_min, taps=taps, max_elements=max_elements)
    else:
        raise ArgumentError(f"argument 'scale_target': expected 'numerator' or 'similarity', got {scale_target!r}")
    if taps is not None:
        taps["gain"] = t
    return out


# ===================================================================================================
# The error bound of the core (running first-order bounds; conventions of refimpl.attention.focused_bounds)
# ===================================================================================================

def _bound(e: np.ndarray, depth: float, what: str, dtype: Any = None) -> numerics.Bound:
    return numerics.running_bound(e, depth, what, dtype)


def _err_core(q, k, v, eq, ek, ev, *, c_min, scale, scale_mode, scale_target, dtype):
    """E of :func:`enhanced_linear_attention` with input errors (ReLU is exact and 1-Lipschitz, so phi's
    errors are the inputs'); applying t to V or phi(K) is one more rounding of that operand."""
    phi_q, phi_k = numerics.relu(q), numerics.relu(k)
    eq, ek = relu_error(q, eq, dtype), relu_error(k, ek, dtype)
    if scale_target == "numerator":
        v_eff, t = _scaled(v, scale, scale_mode, q.shape[1])
        return err_attention(phi_q, phi_k, v_eff, eq, ek, ev * np.abs(t) + np.abs(v_eff), eps=0.0, clamp_min=c_min,
                             dtype=dtype)
    pk, t = _scaled(phi_k, scale, scale_mode, q.shape[1])
    return err_attention(phi_q, pk, v, eq, ek * np.abs(t) + np.abs(pk), ev, eps=0.0, clamp_min=c_min, dtype=dtype)


def enhanced_linear_attention_bound(q: Any, k: Any, v: Any, *, c_min: float = config.L2VIT_C_MIN, scale: Any = 1.0,
                                    scale_mode: str = "divide", scale_target: str = "numerator", dtype: Any = None,
                                    order: str | None = None) -> numerics.Bound:
    """Error bound of :func:`enhanced_linear_attention` (either order; exact inputs).

    :func:`refimpl.attention.focused_bounds.err_attention` with the clamp (max(., C_min) is exact and
    1-Lipschitz, so the normaliser keeps its error; where the clamp is active the quotient divides by C_min) plus
    the rounding of the scaled operand.  Returns numerics.Bound with scale (B, h, N, e).

    References
    ----------
    L2ViT Eq. 4, Appendix 8; docs/design.md "The verdict".
    """
    validation.check_real(c_min, "c_min", minimum=0.0)
    validation.check_option(scale_target, "scale_target", ("numerator", "similarity"))
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h M d"), v=(v, "B h M e"))
    e, depth = _err_core(q, k, v, np.zeros_like(q), np.zeros_like(k), np.zeros_like(v), c_min=c_min, scale=scale,
                         scale_mode=scale_mode, scale_target=scale_target, dtype=dtype)
    return _bound(e, depth + 1, "enhanced linear attention", dtype)
