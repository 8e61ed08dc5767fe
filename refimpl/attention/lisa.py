"""LiSA: structure-aware attention (Eq. 4-8) and its log-linear FFT form (Eq. 9-10, Fig. 7).

Paper: Kim et al., "Learning Structure-Aware Attention ... Lightweight Structure-aware Attention (LiSA)"
(shared/seeds/004_5514759081b50066.txt).  No official code exists; this file is the executable
definition, and every interpretation choice is stated where it is made (and collected in docs/lisa.md).

Shapes
------
B batch; grid (H, W) for images or (T, H, W) for video, r = len(grid); N = prod(grid) tokens, row-major;
C channels; h heads; c = C / h channels per head; D latent channels (Eq. 5).  Per-head tensors q, k, v are
(B, h, N, c).  Toeplitz parameters live on P = prod(2 n_a - 1) relative offsets (Eq. 2, refimpl.toeplitz),
circulant kernels on N offsets (Eq. 10).

The mechanism (per head; Q-bar, K-bar L2-normalised over the c channels of each token):

  Eq. 4  Y_ik = sum_j A_ij R_ij V_jk,                 A_ij = sum_c Qb_ic Kb_jc,   R = T(e) (Eq. 2)
  Eq. 5  Y_ik = sum_d [sum_n A_in Ra_ind] [sum_j Rb_ijd V_jk + Bb_kd]
  Eq. 6  Y_ik = sum_c Qb_ic sum_d [sum_n Kb_nc Ra~_incd] [sum_j Rb_ijd V_jk + Bb_kd]
  Eq. 7  Y_ik = sum_c Qb_ic sum_d [sum_n Kb_nc Ra~_incd + Ba_cd] [sum_j Rb_ijd V_jk + Bb_kd]
  Eq. 8  the same, multiplied out into four terms
  Eq. 9  Y_ik = sum_c Qb_ic sum_d (Ga_icd + Ba_cd)(Gb_ikd + Bb_kd),  Ga = Kb * Ea~,  Gb = V * Eb
  Eq. 10 Ga ~ Kb (*) Wa = F^-1(F(Kb) F(Wa)),  Gb ~ V (*) Wb   (circular convolutions, rfftn over the grid)

Interpretation choices (evidence in docs/lisa.md):
1. Bias multiplicity.  Read literally, sum_{j,n} over (X_n + Ba)(Y_j + Bb) counts Ba N times and Bb N
   times.  Eq. 9, Fig. 6 (``Rb_V + Bb``) and Fig. 7 (``K_Wa + Ba``, ``V_Wb + Bb``) add each bias once,
   after the sum; we follow them (brackets as written above).
2. Heads.  Fig. 6/7 omit heads.  Q, K, V are split into h heads of c channels; L2 normalisation is per
   head over its c channels; Wa (N, c, D), Wb (N, D), Ba, Bb (c, D) are shared by all heads.  This is
   the only layout that reproduces the paper's parameter counts (6.36M for LiSANet-I-T and the D sweep
   5.76/5.88/6.04M, :func:`lisanet_isotropic_param_count`).
3. Convolution orientation.  Eq. 10 is a convolution: Ga[i] = sum_j Wa[(i - j) mod n] Kb[j]; Toeplitz
   RPEs keep Eq. 2's indexing T[i, j] = e[n - 1 + j - i]; refimpl.toeplitz.periodize / embed_circulant
   relate the two.
4. L2 normalisation x / max(||x||, eps), eps = config.LISA_L2_EPS (the paper gives none).
5. ``exact_toeplitz``: Eq. 9 without the circular approximation of Eq. 10: Ga = T(Ea~) Kb by zero-padded
   FFTs of length >= 2n - 1 per axis, with Toeplitz parameters Ea~ ((2n-1).., c, D), Eb ((2n-1).., D).

Contents, in two files.  This one (the public API: it re-exports the public names of the other, so every name
of ``__all__`` is importable from here): configurations and parameter layout; modules on tokens (qkv / output
projections, Fig. 3, §5.1); the block (LN -> LiSA -> LN -> MLP); resolution change of the parameters
(Appendix B); parameter counts (Tables 3, 9); the error bounds of the modules and the block, and LiSA's stage
list.  :mod:`refimpl.attention.lisa_cores` (imported by this one, never the reverse): the helpers, the attention
cores (LiSA Eq. 9-10 with its dispatched FFT kernels' NumPy definitions, SA Eq. 4-8 computed directly, the RPE
matrices), the resampling of the kernels (Appendix B), the error model and the cores' bounds.
Layer: attention (imports config, numerics, validation, layers and lisa_cores).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from .. import bounds, config, numerics, validation
from ..errors import ArgumentError, ParameterKeyError
from ..layers import gelu_bound, layer_norm, linear, linear_bound, mlp, subparams
from ..numerics import Bound, as_float, check_positive_int, check_shapes
from .lisa_cores import (RPE_KINDS, SA_FORMS, TRANSFORMS, _check_grid, _convolve, _fft_lengths,
                         _fft_product_typical, _finish, _guard, _l2, _tr_add,
                         _tr_conv, _tr_core, _tr_l2, lisa_core,
                         lisa_core_bound, resample_circular_kernel, resample_toeplitz_kernel, rpe_matrix, sa_core_bound,
                         sa_elements, sa_eq4, sa_eq5, sa_eq6, sa_eq7, sa_eq8_terms)
from .lisa_grid import GridHeads

__all__ = [
    "LiSAConfig", "SAConfig", "lisa_param_shapes", "sa_param_shapes", "lisa_block_param_shapes",
    "init_params", "lisa_core", "sa_eq4", "sa_eq5", "sa_eq6", "sa_eq7", "sa_eq8_terms", "rpe_matrix",
    "lisa_attention", "structure_aware_attention", "lisa_block", "resample_circular_kernel",
    "resample_toeplitz_kernel", "resize_lisa_params", "lisanet_isotropic_param_count",
    "lisa_core_bound", "sa_core_bound", "lisa_attention_bound", "structure_aware_attention_bound",
    "lisa_block_bound",
]


# ===================================================================================================
# Configurations and parameter layout
# ===================================================================================================

def _check_heads(dim: int, num_heads: int) -> None:
    check_positive_int(dim, "dim")
    check_positive_int(num_heads, "num_heads")
    if dim % num_heads:
        raise ArgumentError(f"argument 'num_heads': dim={dim} is not divisible by num_heads={num_heads}")


@dataclasses.dataclass(frozen=True)
class LiSAConfig(GridHeads):
    """LiSA operator / block configuration (LiSA §4.3, §5.1, Fig. 3, Fig. 7).

    dim : C.  num_heads : h (c = C / h).  grid : token grid (N,), (H, W) or (T, H, W).
    latent : D (default 16, §5.1).
    exact_toeplitz : False = Eq. 10 (circular convolutions, Wa (N, c, D)); True = Eq. 9 exactly with
        Toeplitz parameters ((2n-1).., c, D) by zero-padded FFTs.
    fft_lengths : padded FFT lengths of exact_toeplitz (None: next fast length >= 2n - 1 per axis).
    transform : "rfft" (the paper's RFFT/IRFFT, Appendix A) or "fft" (complex FFTs, real part kept).
    qkv_bias : bias of the qkv projection (True: needed to reproduce Table 3's parameter counts).
    l2_eps, ln_eps, mlp_ratio : see config.LISA_*.
    """

    dim: int
    num_heads: int
    grid: tuple[int, ...]
    latent: int = config.LISA_LATENT_DEFAULT
    exact_toeplitz: bool = False
    fft_lengths: tuple[int, ...] | None = None
    transform: str = "rfft"
    qkv_bias: bool = True
    l2_eps: float = config.LISA_L2_EPS
    ln_eps: float = config.LISA_LN_EPS
    mlp_ratio: float = config.LISA_MLP_RATIO

    def __post_init__(self):
        """Raises ArgumentError / ArgumentTypeError for dim, num_heads not integers >= 1 with C % h == 0, a grid of
        other than 1 to 3 positive axes, a latent D < 1, an eps that is not finite and >= 0, mlp_ratio <= 0, an unknown
        transform, and fft_lengths without exact_toeplitz or shorter than 2n - 1 on an axis.  Stores the grid and
        fft_lengths as tuples of ints."""
        _check_heads(self.dim, self.num_heads)
        object.__setattr__(self, "grid", _check_grid(self.grid))
        check_positive_int(self.latent, "latent")
        validation.check_eps(self.l2_eps, "l2_eps")
        validation.check_eps(self.ln_eps, "ln_eps")
        validation.check_positive(self.mlp_ratio, "mlp_ratio")
        if self.transform not in TRANSFORMS:
            raise ArgumentError(f"argument 'transform': expected one of {TRANSFORMS}, got {self.transform!r}")
        if self.fft_lengths is not None:
            if not self.exact_toeplitz:
                raise ArgumentError("argument 'fft_lengths': only meaningful with exact_toeplitz=True")
            lens = tuple(int(v) for v in self.fft_lengths)
            if len(lens) != len(self.grid) or any(L < 2 * n - 1 for L, n in zip(lens, self.grid)):
                raise ArgumentError(f"argument 'fft_lengths': expected one length >= 2n - 1 per grid axis "
                                 f"{self.grid}, got {self.fft_lengths!r} (shorter lengths wrap around)")
            object.__setattr__(self, "fft_lengths", lens)

    @classmethod
    def preset(cls, name: str = "paper", **overrides: Any) -> "LiSAConfig":
        """"paper": the equations (Eq. 9-10 with rfft, D = 16, shared-head layout).  "official" does not
        exist: the paper promises code ("will be released online") but none is published, so there is no
        released computation to mirror."""
        if name == "paper":
            return cls(**overrides)
        if name == "official":
            raise ArgumentError("LiSAConfig.preset: no 'official' preset - LiSA has no released code; the paper's "
                             "equations and appendix pseudo-code (Fig. 6, 7) are the only definition")
        raise ArgumentError(f"argument 'name': expected 'paper', got {name!r}")

    @property
    def kernel_grid(self) -> tuple[int, ...]:
        """Grid of Wa, Wb: the token grid (circular) or the 2n-1 offsets per axis (exact_toeplitz)."""
        return tuple(2 * n - 1 for n in self.grid) if self.exact_toeplitz else self.grid

    @property
    def mlp_hidden(self) -> int:
        """The block MLP's hidden width int(C mlp_ratio)."""
        return int(self.dim * self.mlp_ratio)


@dataclasses.dataclass(frozen=True)
class SAConfig(GridHeads):
    """Structure-aware attention computed directly with dense RPE tensors (LiSA §4.1-4.2, Fig. 6).

    form : "eq4" (one RPE R, Eq. 4), "eq5" (Ra, Rb, Bb), "eq6" (Hadamard: Ra~ per channel), "eq7" (+ Ba).
    rpe : "toeplitz" (parameters on (2n-1).. offsets, Eq. 2) or "circulant" (kernels on the grid, the
        RPEs that LiSA's circular convolutions realise).
    rpe_per_head : Eq. 4 only - one RPE per head (Table 3b "w/ h RPEs") instead of one shared.
    max_elements : memory guard (default config.QUADRATIC_MAX_ELEMENTS).
    Other fields as :class:`LiSAConfig`.
    """

    dim: int
    num_heads: int
    grid: tuple[int, ...]
    latent: int = config.LISA_LATENT_DEFAULT
    form: str = "eq7"
    rpe: str = "toeplitz"
    rpe_per_head: bool = False
    qkv_bias: bool = True
    l2_eps: float = config.LISA_L2_EPS
    max_elements: int | None = None

    def __post_init__(self):
        """Raises ArgumentError / ArgumentTypeError for dim, num_heads not integers >= 1 with C % h == 0, a grid of
        other than 1 to 3 positive axes, a latent D < 1, an l2_eps that is not finite and >= 0, an unknown form or rpe,
        and rpe_per_head with a form other than "eq4".  Stores the grid as a tuple of ints."""
        _check_heads(self.dim, self.num_heads)
        object.__setattr__(self, "grid", _check_grid(self.grid))
        check_positive_int(self.latent, "latent")
        validation.check_eps(self.l2_eps, "l2_eps")
        if self.form not in SA_FORMS:
            raise ArgumentError(f"argument 'form': expected one of {SA_FORMS}, got {self.form!r}")
        if self.rpe not in RPE_KINDS:
            raise ArgumentError(f"argument 'rpe': expected one of {RPE_KINDS}, got {self.rpe!r}")
        if self.rpe_per_head and self.form != "eq4":
            raise ArgumentError("argument 'rpe_per_head': only defined for form='eq4' (Table 3b)")

    @property
    def kernel_grid(self) -> tuple[int, ...]:
        """Grid of the RPE parameters: the 2n-1 offsets per axis (Toeplitz, Eq. 2) or the token grid (circulant)."""
        return tuple(2 * n - 1 for n in self.grid) if self.rpe == "toeplitz" else self.grid



def _proj_shapes(dim: int, qkv_bias: bool) -> dict[str, tuple[int, ...]]:
    s = {"qkv.weight": (3 * dim, dim)}
    if qkv_bias:
        s["qkv.bias"] = (3 * dim,)
    s["proj.weight"] = (dim, dim)
    s["proj.bias"] = (dim,)
    return s


def lisa_param_shapes(cfg: LiSAConfig) -> dict[str, tuple[int, ...]]:
    """Parameter keys and shapes of the LiSA operator (state_dict keys of the PyTorch twin).

    qkv.weight (3C, C), qkv.bias (3C,), weight_a (P, c, D), weight_b (P, D), bias_a (c, D), bias_b (c, D),
    proj.weight (C, C), proj.bias (C,); P = N (circular, Eq. 10) or prod(2n - 1) (exact_toeplitz, Eq. 9).
    Heads share weight_a, weight_b, bias_a, bias_b (interpretation 2).  References: LiSA Eq. 9-10, Fig. 7.
    """
    validation.check_config(cfg, LiSAConfig)
    c, d, p = cfg.head_dim, cfg.latent, cfg.kernel_tokens
    s = _proj_shapes(cfg.dim, cfg.qkv_bias)
    s.update({"weight_a": (p, c, d), "weight_b": (p, d), "bias_a": (c, d), "bias_b": (c, d)})
    return s


def sa_param_shapes(cfg: SAConfig) -> dict[str, tuple[int, ...]]:
    """Parameter keys and shapes of structure-aware attention computed directly (LiSA Eq. 4-7, Fig. 6).

    eq4: rpe (P,) or (P, h) with rpe_per_head; eq5: weight_a (P, D), weight_b (P, D), bias_b (c, D);
    eq6: weight_a (P, c, D), weight_b (P, D), bias_b (c, D); eq7: eq6 + bias_a (c, D);
    plus the qkv / proj projections.  P = prod(2n - 1) (toeplitz) or N (circulant).
    """
    validation.check_config(cfg, SAConfig)
    c, d, p = cfg.head_dim, cfg.latent, cfg.kernel_tokens
    s = _proj_shapes(cfg.dim, cfg.qkv_bias)
    if cfg.form == "eq4":
        s["rpe"] = (p, cfg.num_heads) if cfg.rpe_per_head else (p,)
    elif cfg.form == "eq5":
        s.update({"weight_a": (p, d), "weight_b": (p, d), "bias_b": (c, d)})
    else:
        s.update({"weight_a": (p, c, d), "weight_b": (p, d), "bias_b": (c, d)})
        if cfg.form == "eq7":
            s["bias_a"] = (c, d)
    return s


def lisa_block_param_shapes(cfg: LiSAConfig) -> dict[str, tuple[int, ...]]:
    """Keys and shapes of the LiSA block (LN -> LiSA -> LN -> MLP, §5.1, Fig. 3): norm1.{weight,bias} (C,),
    attn.* (:func:`lisa_param_shapes`), norm2.{weight,bias}, mlp.fc1.weight (C r, C), mlp.fc1.bias,
    mlp.fc2.weight (C, C r), mlp.fc2.bias (C,)."""
    validation.check_config(cfg, LiSAConfig)
    dim, hid = cfg.dim, cfg.mlp_hidden
    s = {"norm1.weight": (dim,), "norm1.bias": (dim,)}
    s.update({f"attn.{k}": v for k, v in lisa_param_shapes(cfg).items()})
    s.update({"norm2.weight": (dim,), "norm2.bias": (dim,), "mlp.fc1.weight": (hid, dim), "mlp.fc1.bias": (hid,),
              "mlp.fc2.weight": (dim, hid), "mlp.fc2.bias": (dim,)})
    return s


def init_params(shapes: Mapping[str, tuple[int, ...]], seed: int = 0,
                std: float = config.LISA_INIT_STD) -> dict[str, np.ndarray]:
    """Random float64 parameters for ``shapes`` (tests, benchmarks): N(0, std^2), except LayerNorm
    weights 1 + N(0, std^2).  Not the paper's training initialisation (it gives none)."""
    validation.check_mapping(shapes, "shapes", "a mapping of state_dict keys to shapes")
    std = validation.check_real(std, "std", minimum=0.0)
    rng = np.random.default_rng(validation.check_seed(seed))
    out = {}
    for k, shp in shapes.items():
        v = rng.standard_normal(shp) * std
        if k.endswith(("norm1.weight", "norm2.weight")) or k == "norm.weight":
            v = v + 1.0
        out[k] = v
    return out


# ===================================================================================================
# Modules on tokens: qkv projection -> heads -> core -> output projection (Fig. 3, Fig. 6-7)
# ===================================================================================================

def _param(p: Mapping[str, Any], key: str, where: str) -> np.ndarray:
    if key not in p:
        raise ParameterKeyError(f"{where}: missing parameter '{key}'")
    return as_float(p[key], key)


def _check_params(params: Any, expected: Mapping[str, tuple[int, ...]], where: str) -> None:
    """The strict parameter check (:func:`refimpl.validation.check_params`) against :func:`lisa_param_shapes`,
    :func:`sa_param_shapes` or :func:`lisa_block_param_shapes`."""
    validation.check_params(params, expected, where=where)


def _qkv_heads(x: np.ndarray, params: Mapping[str, Any], dim: int, heads: int, qkv_bias: bool, where: str):
    check_shapes(x=(x, "B N C"), sizes={"C": dim})
    w = _param(params, "qkv.weight", where)
    b = _param(params, "qkv.bias", where) if qkv_bias else None
    qkv = linear(x, w, b)                                                # (B, N, 3C)
    bsz, n_tok = x.shape[:2]
    qkv = qkv.reshape(bsz, n_tok, 3, heads, dim // heads).transpose(2, 0, 3, 1, 4)
    return qkv, qkv[0], qkv[1], qkv[2]


def _merge_proj(out: np.ndarray, params: Mapping[str, Any], where: str):
    bsz, h, n_tok, c = out.shape
    merged = out.transpose(0, 2, 1, 3).reshape(bsz, n_tok, h * c)
    return merged, linear(merged, _param(params, "proj.weight", where), _param(params, "proj.bias", where))


def lisa_attention(x: Any, params: Mapping[str, Any], cfg: LiSAConfig, *, taps: dict | None = None) -> np.ndarray:
    """The LiSA operator on tokens (Fig. 7 with heads): qkv = x Wqkv^T + b; split into h heads;
    :func:`lisa_core`; merge heads; output projection.

    Parameters
    ----------
    x : (B, N, C) float tokens, N = prod(cfg.grid), row-major over the grid.
    params : mapping with the keys of :func:`lisa_param_shapes`.
    cfg : :class:`LiSAConfig`.
    taps : optional dict: "qkv" (3, B, h, N, c), the :func:`lisa_core` taps, "merged" (B, N, C).

    Returns
    -------
    (B, N, C) float array.

    References
    ----------
    LiSA Eq. 9-10, Fig. 3, Fig. 7, §5.1.
    """
    validation.check_config(cfg, LiSAConfig)
    x = as_float(x, "x")
    check_shapes(x=(x, "B N C"), sizes={"N": cfg.num_tokens, "C": cfg.dim})
    _check_params(params, lisa_param_shapes(cfg), "lisa_attention")
    validation.check_taps(taps)
    qkv, q, k, v = _qkv_heads(x, params, cfg.dim, cfg.num_heads, cfg.qkv_bias, "lisa_attention")
    out = lisa_core(q, k, v, _param(params, "weight_a", "lisa_attention"), _param(params, "weight_b", "lisa_attention"),
                    _param(params, "bias_a", "lisa_attention"), _param(params, "bias_b", "lisa_attention"),
                    cfg.grid, exact_toeplitz=cfg.exact_toeplitz, fft_lengths=cfg.fft_lengths,
                    transform=cfg.transform, eps=cfg.l2_eps, taps=taps)
    merged, y = _merge_proj(out, params, "lisa_attention")
    if taps is not None:
        taps.update({"qkv": qkv, "merged": merged})
    return y


def structure_aware_attention(x: Any, params: Mapping[str, Any], cfg: SAConfig, *,
                              taps: dict | None = None) -> np.ndarray:
    """Structure-aware attention (Eq. 4-7) on tokens, computed directly with dense RPE tensors (Fig. 6).

    Parameters
    ----------
    x : (B, N, C) float.  params : keys of :func:`sa_param_shapes`.  cfg : :class:`SAConfig`.
    taps : "qkv", the core's taps, "rpe" / "ra" / "rb" (the dense RPE tensors), "merged".

    Returns
    -------
    (B, N, C) float array.

    Raises
    ------
    ValueError when the quadratic tensors exceed the memory guard (use :func:`lisa_attention`).

    References
    ----------
    LiSA Eq. 4-7, Fig. 6.
    """
    validation.check_config(cfg, SAConfig)
    x = as_float(x, "x")
    check_shapes(x=(x, "B N C"), sizes={"N": cfg.num_tokens, "C": cfg.dim})
    _check_params(params, sa_param_shapes(cfg), "structure_aware_attention")
    validation.check_taps(taps)
    bsz, n_tok = x.shape[:2]
    _guard(sa_elements(bsz, cfg.num_heads, n_tok, cfg.head_dim, cfg.latent, cfg.form), cfg.max_elements,
           "structure_aware_attention")
    qkv, q, k, v = _qkv_heads(x, params, cfg.dim, cfg.num_heads, cfg.qkv_bias, "structure_aware_attention")
    w = "structure_aware_attention"
    kw = dict(eps=cfg.l2_eps, taps=taps, max_elements=cfg.max_elements)
    big = cfg.max_elements
    if cfg.form == "eq4":
        r = rpe_matrix(_param(params, "rpe", w), cfg.grid, cfg.rpe, max_elements=big)
        r = np.moveaxis(r, -1, 0) if r.ndim == 3 else r                       # (h, N, N) per head
        out = sa_eq4(q, k, v, r, **kw)
        rpes = {"rpe": r}
    else:
        ra = rpe_matrix(_param(params, "weight_a", w), cfg.grid, cfg.rpe, max_elements=big)
        rb = rpe_matrix(_param(params, "weight_b", w), cfg.grid, cfg.rpe, max_elements=big)
        bb = _param(params, "bias_b", w)
        if cfg.form == "eq5":
            out = sa_eq5(q, k, v, ra, rb, bb, **kw)
        elif cfg.form == "eq6":
            out = sa_eq6(q, k, v, ra, rb, bb, **kw)
        else:
            out = sa_eq7(q, k, v, ra, rb, _param(params, "bias_a", w), bb, **kw)
        rpes = {"ra": ra, "rb": rb}
    merged, y = _merge_proj(out, params, w)
    if taps is not None:
        taps.update({"qkv": qkv, "merged": merged, **rpes})
    return y


# ===================================================================================================
# The LiSA block (§5.1, Fig. 3): x + LiSA(LN(x)), then + MLP(LN(.))
# ===================================================================================================

def lisa_block(x: Any, params: Mapping[str, Any], cfg: LiSAConfig, *, taps: dict | None = None) -> np.ndarray:
    """LiSA block: y = x + LiSA(LN1(x)); out = y + MLP(LN2(y)), MLP = fc2(GELU(fc1)) (pre-norm transformer
    order "LN, attention operator, LN and MLP", §5.1).

    Parameters
    ----------
    x : (B, N, C) float.  params : keys of :func:`lisa_block_param_shapes`.  cfg : :class:`LiSAConfig`.
    taps : "ln1", "attn" (LiSA output), "resid1", "ln2", "mlp", and the attention's taps under "attn.".

    Returns
    -------
    (B, N, C) float array.

    References
    ----------
    LiSA §5.1 ("LiSA block"), Fig. 3.
    """
    validation.check_config(cfg, LiSAConfig)
    x = as_float(x, "x")
    check_shapes(x=(x, "B N C"), sizes={"N": cfg.num_tokens, "C": cfg.dim})
    _check_params(params, lisa_block_param_shapes(cfg), "lisa_block")
    validation.check_taps(taps)
    ln1 = layer_norm(x, _param(params, "norm1.weight", "lisa_block"), _param(params, "norm1.bias", "lisa_block"),
                     cfg.ln_eps)
    inner: dict | None = {} if taps is not None else None
    a = lisa_attention(ln1, subparams(params, "attn"), cfg, taps=inner)
    y = x + a
    ln2 = layer_norm(y, _param(params, "norm2.weight", "lisa_block"), _param(params, "norm2.bias", "lisa_block"),
                     cfg.ln_eps)
    m = mlp(ln2, subparams(params, "mlp"))
    out = y + m
    if taps is not None:
        taps.update({"ln1": ln1, "attn": a, "resid1": y, "ln2": ln2, "mlp": m, "out": out})
        taps.update({f"attn.{k}": v for k, v in inner.items()})
    return out


# ===================================================================================================
# Resolution change (Appendix B, Table 9)
# ===================================================================================================

def resize_lisa_params(params: Mapping[str, Any], cfg: LiSAConfig, new_grid: Sequence[int]
                       ) -> tuple[dict[str, np.ndarray], LiSAConfig]:
    """Move LiSA parameters to a new token grid (Appendix B): every key ending in "weight_a" or
    "weight_b" is resampled (:func:`resample_circular_kernel`, or :func:`resample_toeplitz_kernel` with
    exact_toeplitz); everything else is unchanged.  Works on operator, block or network mappings.

    Returns (new params, cfg with the new grid).  References: LiSA Appendix B, Table 9.
    """
    validation.check_config(cfg, LiSAConfig)
    validation.check_mapping(params, "params", "a mapping of state_dict keys to float arrays")
    validation.check_param_values(params, where="resize_lisa_params")
    new_cfg = dataclasses.replace(cfg, grid=_check_grid(new_grid, "new_grid"), fft_lengths=None)
    fn = resample_toeplitz_kernel if cfg.exact_toeplitz else resample_circular_kernel
    out = {}
    for k, v in params.items():
        out[k] = fn(v, cfg.grid, new_cfg.grid) if k.endswith(("weight_a", "weight_b")) else np.asarray(v)
    return out, new_cfg


# ===================================================================================================
# Parameter counts (Table 3, Table 9): shapes only, nothing allocated
# ===================================================================================================

LAYOUTS = ("shared", "no_bias", "per_head_bias", "per_head", "full_width")


def lisanet_isotropic_param_count(*, img_size: int | Sequence[int] = 224, patch_size: int = 16, in_chans: int = 3,
                                  dim: int = 192, depth: int = 12, num_heads: int = 12,
                                  latent: int = config.LISA_LATENT_DEFAULT, mlp_ratio: float = config.LISA_MLP_RATIO,
                                  num_classes: int = 1000, pos_embed: bool = True, cls_token: bool = False,
                                  qkv_bias: bool = True, layout: str = "shared",
                                  exact_toeplitz: bool = False, local_kernel: int | None = None) -> dict[str, int]:
    """Parameter count of an isotropic LiSANet (LiSANet-I-T: Table 2, Table 7) from its configuration.

    Network (DeiT/ViT layout [45], global-average-pooling classifier of Table 7): patch embedding
    (conv patch x patch, stride patch, with bias), optional absolute position embedding (N, C), optional
    class token, ``depth`` LiSA blocks (:func:`lisa_block_param_shapes`), final LayerNorm, linear head.

    ``layout`` states how heads share the LiSA weights; only "shared" is implemented by the operator,
    the others are counted to show they do not match the paper:
      shared        Wa (N, c, D), Wb (N, D), Ba, Bb (c, D) shared by all heads   (our choice)
      no_bias       shared, without Ba, Bb
      per_head_bias shared Wa, Wb; Ba, Bb per head (C, D)
      per_head      every head its own Wa, Wb, Ba, Bb
      full_width    Wa (N, C, D) over all channels (no weight sharing across heads; c replaced by C)

    ``local_kernel`` = k replaces the global kernels by local k x k ones (P = k^2 kernel taps instead of N),
    the "Local - k x k" rows of Table 3c.

    Returns a dict with "patch_embed", "pos_embed", "cls_token", "blocks", "lisa_per_block", "norm",
    "head" and "total".  References: LiSA Table 2, 3a, 3c, 3d, 7, 9; Appendix A.1.
    """
    if layout not in LAYOUTS:
        raise ArgumentError(f"argument 'layout': expected one of {LAYOUTS}, got {layout!r}")
    patch_size = validation.check_int(patch_size, "patch_size", minimum=1)
    for name, val, least in (("in_chans", in_chans, 1), ("depth", depth, 0), ("num_classes", num_classes, 0)):
        validation.check_int(val, name, minimum=least)
    if isinstance(img_size, (tuple, list)):
        size = validation.check_int_tuple(img_size, "img_size", 2, minimum=1)
    else:
        size = (validation.check_int(img_size, "img_size", minimum=1),) * 2
    if min(size) < patch_size:
        raise ArgumentError(f"argument 'img_size': expected at least patch_size = {patch_size} per axis, got {size}")
    grid = (size[0] // patch_size, size[1] // patch_size)
    cfg = LiSAConfig(dim=dim, num_heads=num_heads, grid=grid, latent=latent, exact_toeplitz=exact_toeplitz,
                     qkv_bias=qkv_bias, mlp_ratio=mlp_ratio)
    shapes = lisa_block_param_shapes(cfg)
    c, d, p, h = cfg.head_dim, latent, cfg.kernel_tokens, num_heads
    if local_kernel is not None:
        p = check_positive_int(local_kernel, "local_kernel") ** 2
    lisa_keys = ("attn.weight_a", "attn.weight_b", "attn.bias_a", "attn.bias_b")
    block_other = sum(int(np.prod(s)) for k, s in shapes.items() if k not in lisa_keys)
    lisa = {"shared": p * c * d + p * d + 2 * c * d,
            "no_bias": p * c * d + p * d,
            "per_head_bias": p * c * d + p * d + 2 * h * c * d,
            "per_head": h * (p * c * d + p * d + 2 * c * d),
            "full_width": p * dim * d + p * d + 2 * dim * d}[layout]
    n_tok = grid[0] * grid[1]
    parts = {
        "patch_embed": in_chans * patch_size * patch_size * dim + dim,
        "pos_embed": ((n_tok + (1 if cls_token else 0)) * dim) if pos_embed else 0,
        "cls_token": dim if cls_token else 0,
        "lisa_per_block": lisa,
        "blocks": depth * (block_other + lisa),
        "norm": 2 * dim,
        "head": dim * num_classes + num_classes,
    }
    parts["total"] = sum(v for k, v in parts.items() if k != "lisa_per_block")
    return parts


# ===================================================================================================
# Error bounds of the modules (the error model and the cores' bounds: refimpl.attention.lisa_cores)
# ===================================================================================================

def _tr_linear(x, ex, w, b):
    n = w.shape[-1] + (1 if b is not None else 0)
    y = linear(x, w, b)
    err = n * linear(np.abs(x), np.abs(w), None if b is None else np.abs(b))
    if ex is not None:
        err = err + linear(ex, np.abs(w))
    return y, err, n


def _tr_attention(x, ex, params, cfg, *, kind):
    where = "bound"
    qkv, eqkv, d0 = _tr_linear(x, ex, _param(params, "qkv.weight", where),
                               _param(params, "qkv.bias", where) if cfg.qkv_bias else None)
    bsz, n_tok = x.shape[:2]
    h, c = cfg.num_heads, cfg.head_dim

    def heads(a):
        return a.reshape(bsz, n_tok, 3, h, c).transpose(2, 0, 3, 1, 4)

    q, k, v = heads(qkv)
    eq, ek, ev = heads(eqkv)
    if kind == "lisa":
        weights = {n: _param(params, n, where) for n in ("weight_a", "weight_b", "bias_a", "bias_b")}
        out, eout, d1 = _tr_core(q, eq, k, ek, v, ev, cfg.grid, kind="lisa", eps=cfg.l2_eps,
                                 exact_toeplitz=cfg.exact_toeplitz, fft_lengths=cfg.fft_lengths, weights=weights)
    else:
        weights = {}
        if cfg.form == "eq4":
            r = rpe_matrix(_param(params, "rpe", where), cfg.grid, cfg.rpe)
            weights["rpe"] = np.moveaxis(r, -1, 0) if r.ndim == 3 else r
        else:
            weights["rb"] = rpe_matrix(_param(params, "weight_b", where), cfg.grid, cfg.rpe)
            weights["bias_b"] = _param(params, "bias_b", where)
            ra = rpe_matrix(_param(params, "weight_a", where), cfg.grid, cfg.rpe)
            if cfg.form == "eq5":
                weights["ra"] = ra
            else:
                weights["ra_tilde"] = ra
            if cfg.form == "eq7":
                weights["bias_a"] = _param(params, "bias_a", where)
        out, eout, d1 = _tr_core(q, eq, k, ek, v, ev, cfg.grid, kind=cfg.form, eps=cfg.l2_eps, weights=weights)

    def merge(a):
        return a.transpose(0, 2, 1, 3).reshape(bsz, n_tok, h * c)

    y, ey, d2 = _tr_linear(merge(out), merge(eout), _param(params, "proj.weight", where),
                           _param(params, "proj.bias", where))
    return y, ey, d0 + d1 + d2


def lisa_attention_bound(x: Any, params: Mapping[str, Any], cfg: LiSAConfig, *, dtype: Any = None) -> Bound:
    """Error bound of :func:`lisa_attention` in precision T: qkv projection (gamma_{C+1}), then
    :func:`lisa_core_bound`'s stages with the projection's error propagated, then the output projection
    (|Wp| E + gamma_{C+1} (|o||Wp|^T + |b|)).  Returns numerics.Bound with scale (B, N, C).
    References: LiSA Eq. 9-10, Fig. 7; Higham (2002) ch. 3."""
    validation.check_config(cfg, LiSAConfig)
    x = as_float(x, "x")
    check_shapes(x=(x, "B N C"), sizes={"N": cfg.num_tokens, "C": cfg.dim})
    _check_params(params, lisa_param_shapes(cfg), "lisa_attention_bound")
    y, ey, depth = _tr_attention(x, None, params, cfg, kind="lisa")
    return _finish(y, ey, depth, dtype, "lisa_attention")


def lisa_attention_stages(params: Mapping[str, Any], cfg: LiSAConfig, *, fine: bool = False
                          ) -> list[numerics.Stage]:
    """The stages of :func:`lisa_attention`, for :func:`refimpl.verdict.compare_stages`.

    Tensors: "x" (B, N, C) (the qkv projection's input); "qkv" (B, N, 3C); "core" (B, N, C), :func:`lisa_core`
    with heads merged (the output projection's input); "proj" (B, N, C).  ``fine``: the core cut into "qn", "kn"
    (B, h, N, c), the L2-normalised Q and K; "ga" (B, h, N, c, D), Kn convolved with Wa plus Ba; "gb"
    (B, h, N, c, D), V convolved with Wb plus Bb; and "core", the contraction of Eq. 10 with heads merged.  The
    whole core's bound carries the FFTs' norm-wise bound (refimpl.toeplitz.fft_convolution_bound's scale, the
    same for every output) through the contraction; cut there, each stage is judged against its own bound.

    References
    ----------
    LiSA Eq. 9-10, Fig. 7; docs/design.md "Stages".
    """
    where = "lisa_attention_stages"
    _check_params(params, lisa_param_shapes(cfg), where)
    h, c = cfg.num_heads, cfg.head_dim
    w = {n: _param(params, n, where) for n in ("weight_a", "weight_b", "bias_a", "bias_b")}
    opts = dict(exact_toeplitz=cfg.exact_toeplitz, fft_lengths=cfg.fft_lengths, eps=cfg.l2_eps)

    def heads(qkv):
        b, n, _ = qkv.shape
        t = qkv.reshape(b, n, 3, h, c).transpose(2, 0, 3, 1, 4)
        return t[0], t[1], t[2]

    def merge(o):
        return o.transpose(0, 2, 1, 3).reshape(o.shape[0], o.shape[2], h * c)

    def core(qkv):
        return merge(lisa_core(*heads(qkv), w["weight_a"], w["weight_b"], w["bias_a"], w["bias_b"], cfg.grid,
                               transform=cfg.transform, **opts))

    def core_bound(qkv, dtype=None):
        b = lisa_core_bound(*heads(qkv), w["weight_a"], w["weight_b"], w["bias_a"], w["bias_b"], cfg.grid,
                            dtype=dtype, **opts)
        return b.relayout(merge)

    def lin(name, source, key, bias):
        wt, bt = _param(params, key + ".weight", where), (_param(params, key + ".bias", where) if bias else None)
        return numerics.Stage(name, (source,), lambda t: linear(t, wt, bt),
                              lambda t, dtype=None: linear_bound(t, wt, bt), f"LiSA Fig. 7: the {key} projection")

    if not fine:
        return [lin("qkv", "x", "qkv", cfg.qkv_bias),
                numerics.Stage("core", ("qkv",), core, core_bound, "LiSA Eq. 9-10: L2-normalised Q, K; Toeplitz "
                                                                   "(FFT) convolutions of K and V; the contraction"),
                lin("proj", "core", "proj", True)]

    def l2_stage(name, index):
        def bound(qkv, dtype=None):
            y, err, depth = _tr_l2(heads(qkv)[index], None, cfg.l2_eps)
            b = numerics.running_bound(err, depth, f"L2 normalisation of {name[0].upper()}", dtype)
            # The l2 coefficient of its roundings (Bound.typical): the norm's c squares and c - 1 additions, each
            # with a coefficient <= ||x||^2 in the sum of squares (numerics.sum_depth_l2(c) of them), reach y_i
            # halved by the square root: (1/4) sum_depth_l2(c) y_i^2; the sqrt, the scaling and the quotient one
            # |y_i| each.
            count = numerics.sum_depth_l2(y.shape[-1], dtype) / 4.0 + 3.0
            return dataclasses.replace(b, typical=math.sqrt(count) * np.abs(y))

        return numerics.Stage(name, ("qkv",), lambda qkv: _l2(heads(qkv)[index], cfg.l2_eps), bound,
                              f"LiSA Eq. 10: {name[0].upper()} / ||{name[0].upper()}||")

    def conv(x, key):                            # (B, h, N, c or 1) -> (B, h, N, c, D), before the bias
        kern = w[key] if key == "weight_a" else w[key][:, None, :]
        return _tr_conv(x[..., None], None, kern, cfg.grid, exact_toeplitz=cfg.exact_toeplitz,
                        fft_lengths=cfg.fft_lengths)

    grid = tuple(cfg.grid)
    lens = _fft_lengths(grid, cfg.exact_toeplitz, cfg.fft_lengths)

    def conv_with(key, bias_key, of, transform, lengths):
        def fn(t):
            kern = w[key] if key == "weight_a" else w[key][:, None, :]
            return _convolve(of(t)[..., None], kern, grid, cfg.exact_toeplitz, lengths, transform) + w[bias_key]
        return fn

    def conv_stage(name, source, key, bias_key, of):
        def bound(t, dtype=None):
            # the FFT product's own bound (its transforms' arithmetic in the accumulation format, then rounded
            # to T: numerics.sum_depth-style counting), the rounding of that result, and the bias addition
            x = of(t)
            y, err, k = conv(x, key)
            r = numerics.accumulation_ratio(dtype)
            e = err * r + np.abs(y) + (np.abs(y) + np.abs(w[bias_key]))
            b = numerics.running_bound(e, k * r + 2, f"{name}: FFT convolution, then + bias", dtype)
            kern = w[key] if key == "weight_a" else w[key][:, None, :]
            fft = _fft_product_typical(x, kern, grid, cfg.exact_toeplitz, lens)
            return dataclasses.replace(b, typical=np.hypot(r * fft, np.hypot(y, y + w[bias_key])))

        other = "fft" if cfg.transform == "rfft" else "rfft"
        alternatives = [(f"{other} convolution", conv_with(key, bias_key, of, other, cfg.fft_lengths))]
        if cfg.exact_toeplitz:
            pow2 = tuple(1 << (2 * n - 2).bit_length() for n in grid)
            if pow2 != tuple(lens):
                alternatives.append((f"rfft convolution on {pow2}", conv_with(key, bias_key, of, "rfft", pow2)))
        return numerics.Stage(name, (source,), conv_with(key, bias_key, of, cfg.transform, cfg.fft_lengths), bound,
                              f"LiSA Eq. 9-10: the Toeplitz/circulant product with {key} (by FFT) plus {bias_key}",
                              alternatives=tuple(alternatives))

    def contraction(qn, ga, gb):
        return merge(np.einsum("bhic,bhicd,bhivd->bhiv", qn, ga, gb, optimize=True))

    def contraction_bound(qn, ga, gb, dtype=None):
        spec = "bhic,bhicd,bhivd->bhiv"
        s_abs = np.einsum(spec, np.abs(qn), np.abs(ga), np.abs(gb), optimize=True)
        n_terms = qn.shape[-1] * ga.shape[-1]
        # each term: two products and its share of the c D-term sum (whatever the association order)
        k = numerics.sum_depth(n_terms + 1, dtype) + 1
        return numerics.running_bound(merge(k * s_abs), k, "the contraction of Eq. 10 (c D terms)", dtype)

    return [lin("qkv", "x", "qkv", cfg.qkv_bias), l2_stage("qn", 0), l2_stage("kn", 1),
            conv_stage("ga", "kn", "weight_a", "bias_a", lambda kn: kn),
            conv_stage("gb", "qkv", "weight_b", "bias_b", lambda qkv: heads(qkv)[2]),
            numerics.Stage("core", ("qn", "ga", "gb"), contraction, contraction_bound,
                           "LiSA Eq. 10: sum_c sum_d Qn_c (Ga)_cd (Gb)_vd"),
            lin("proj", "core", "proj", True)]


def structure_aware_attention_bound(x: Any, params: Mapping[str, Any], cfg: SAConfig, *, dtype: Any = None) -> Bound:
    """Error bound of :func:`structure_aware_attention` in precision T (as :func:`lisa_attention_bound`
    with dense RPE products).  Returns numerics.Bound with scale (B, N, C).  References: LiSA Eq. 4-7."""
    validation.check_config(cfg, SAConfig)
    x = as_float(x, "x")
    check_shapes(x=(x, "B N C"), sizes={"N": cfg.num_tokens, "C": cfg.dim})
    _check_params(params, sa_param_shapes(cfg), "structure_aware_attention_bound")
    _guard(sa_elements(x.shape[0], cfg.num_heads, x.shape[1], cfg.head_dim, cfg.latent, cfg.form),
           cfg.max_elements, "structure_aware_attention_bound")
    y, ey, depth = _tr_attention(x, None, params, cfg, kind="sa")
    return _finish(y, ey, depth, dtype, f"structure_aware_attention ({cfg.form}, {cfg.rpe})")


def _tr_layer_norm(x, ex, w, b, eps, dtype):
    """LayerNorm over the channels with input error E (units of u_T): the calculus's rule,
    refimpl.bounds.e_layer_norm with Precision.coefficients(dtype) (first order): k S + |w| / s (E + mean E
    + |xh| mean(|xh| E)), k = sum_depth(n) + 8, the two n-term sums accumulated in config.ACCUMULATION_FORMAT.
    Against the rule formerly written here (the same S and Jacobian, the sums charged at u_T: k = n + 8),
    measured on random inputs (24 block configurations, C = 2 .. 15): float32 / float64 unchanged (new / old
    of lisa_block_bound within 4.4e-16 of 1); float16 and bfloat16 smaller, the exact-input LayerNorm term by
    about 9 / (C + 8), lisa_block_bound by new / old min 0.62, median 0.76, max 0.98 (float16) and 0.32,
    0.59, 0.87 (bfloat16, where finite: 120 elements of 894 stay infinite, against 165 before)."""
    pr = bounds.Precision.coefficients(dtype)
    err, k = bounds.e_layer_norm(x, np.zeros_like(x) if ex is None else ex, w, b, eps, pr)
    return layer_norm(x, w, b, eps), err, k


def lisa_block_bound(x: Any, params: Mapping[str, Any], cfg: LiSAConfig, *, dtype: Any = None) -> Bound:
    """Error bound of :func:`lisa_block` in precision T, first order: LN1 (the calculus's LayerNorm rule,
    :func:`_tr_layer_norm`), LiSA with LN1's error propagated (:func:`lisa_attention_bound`'s stages), the
    residual sum, LN2 with the propagated error (the same rule), the MLP (fc1, GELU with Lipschitz
    constant config.GELU_LIPSCHITZ and refimpl.layers.gelu_bound, fc2) and the final residual sum.
    Not rigorous beyond the assumed libm accuracy of erf (config.ELEMENTARY_FUNCTION_ULPS) and the FFT
    depth heuristic.  Returns numerics.Bound with scale (B, N, C).  References: LiSA §5.1, Fig. 3."""
    validation.check_config(cfg, LiSAConfig)
    x = as_float(x, "x")
    check_shapes(x=(x, "B N C"), sizes={"N": cfg.num_tokens, "C": cfg.dim})
    _check_params(params, lisa_block_param_shapes(cfg), "lisa_block_bound")
    p = params
    l1, el1, d0 = _tr_layer_norm(x, None, _param(p, "norm1.weight", "bound"), _param(p, "norm1.bias", "bound"),
                                 cfg.ln_eps, dtype)
    a, ea, d1 = _tr_attention(l1, el1, subparams(p, "attn"), cfg, kind="lisa")
    y, ey = _tr_add(x, None, a, ea)
    l2, el2, d2 = _tr_layer_norm(y, ey, _param(p, "norm2.weight", "bound"), _param(p, "norm2.bias", "bound"),
                                 cfg.ln_eps, dtype)
    hdn, eh, d3 = _tr_linear(l2, el2, _param(p, "mlp.fc1.weight", "bound"), _param(p, "mlp.fc1.bias", "bound"))
    gb = gelu_bound(hdn)
    g = numerics.gelu(hdn)
    eg = config.GELU_LIPSCHITZ * eh + gb.k * np.asarray(gb.scale)
    m, em, d4 = _tr_linear(g, eg, _param(p, "mlp.fc2.weight", "bound"), _param(p, "mlp.fc2.bias", "bound"))
    out, eout = _tr_add(y, ey, m, em)
    return _finish(out, eout, d0 + d1 + 1 + d2 + d3 + gb.k + d4 + 1, dtype, "lisa_block")
