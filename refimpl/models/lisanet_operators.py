"""LiSA's Table 3b operators inside a LiSANet block: self-attention (with or without Toeplitz RPEs, one or h of
them) and the structure-aware attentions of Eq. 4, 5 and 7, each replacing LiSA in the block (§5.2: "we only
replace our operator with others in the LiSA blocks"), Table 3c's LiSA with local k x k kernels
("lisa_local", refimpl.attention.lisa_local) and Table 3a's convolution rows ("dwconv", "gf": :data:`CONV_OPERATORS`),
with their error propagation; and the block's two residual branches, for LiSA itself as for every operator
(:func:`block_part`, :func:`e_block_part`: the network's block parts, lisanet.unit_parts).

Layer: networks.  Used by refimpl.models.lisanet (its ``operator`` field, :data:`refimpl.models.lisanet.OPERATORS`),
which passes the operator's :class:`refimpl.attention.lisa.SAConfig` (``lisanet.sa_config``) and the block's
:class:`refimpl.attention.lisa.LiSAConfig` (``lisanet.block_config``); this module imports nothing from it.

References: LiSA (../shared/seeds/004_*.txt) Eq. 2-5, 7, 9, Fig. 6, Table 3a-3c; GFNet (Rao et al. 2021, [39]).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics, toeplitz as tz
from ..attention import lisa, lisa_local
from ..attention import softmax as _softmax
from . import _netparts as nets
from . import common, counting
from .common import Err

__all__ = ["heads", "merge", "rpe_weights", "operator", "BLOCK_PARTS", "block_part", "operator_block", "e_operator",
           "e_block_part", "e_operator_block",
           "CONV_OPERATORS", "conv_operator_shapes", "global_filter", "conv_operator_macs"]

#: Table 3a's convolution rows in the LiSA block: "dwconv" (Depthwise conv (7 x 7) [19]) and "gf" (GF layer [39],
#: GFNet's global filter: irfft2(rfft2(X) o K), K complex (H, W // 2 + 1, C)), each followed by the block's C x C
#: output projection, without biases: the reading that gives the printed parameters (4.49M, 4.90M); with a
#: projection bias the depthwise row would be 4.50M (docs/models_l2vit_ravlt_lisanet.md, "LiSA Table 3 variants").
CONV_OPERATORS = ("dwconv", "gf")
#: The residual branches of a LiSANet block, in order (:func:`block_part`): x + op(LN1 x), then + MLP(LN2 .).
BLOCK_PARTS = ("attn", "mlp")
DWCONV_KERNEL = 7       # Table 3a "Depthwise conv (7 x 7)"


def conv_operator_shapes(op: str, dim: int, grid: tuple[int, int]) -> dict[str, tuple[int, ...]]:
    """"dwconv": dwconv.weight (C, 1, 7, 7); "gf": complex_weight (H, W // 2 + 1, C, 2) (real, imaginary parts,
    GFNet's layout); both proj.weight (C, C)."""
    if op == "dwconv":
        s = {"dwconv.weight": (dim, 1, DWCONV_KERNEL, DWCONV_KERNEL)}
    else:
        s = {"complex_weight": (grid[0], grid[1] // 2 + 1, dim, 2)}
    s["proj.weight"] = (dim, dim)
    return s


def global_filter(x: np.ndarray, weight: Any, grid: tuple[int, int]) -> np.ndarray:
    """GF layer (GFNet [39] Eq. 3-4) on tokens (B, N, C): X = rfft2 over the (H, W) grid, X o K with
    K = weight[..., 0] + i weight[..., 1] (H, W // 2 + 1, C), irfft2 back to (B, N, C).  A circular convolution
    with the kernel irfft2(K) (:func:`_gf_kernel`; irfft2 keeps only K's Hermitian part)."""
    b, n, c = x.shape
    w = numerics.as_float(weight, "complex_weight")
    xf = np.fft.rfft2(x.reshape(b, grid[0], grid[1], c), axes=(1, 2))
    y = np.fft.irfft2(xf * (w[..., 0] + 1j * w[..., 1]), s=grid, axes=(1, 2))
    return y.reshape(b, n, c)


def _gf_kernel(weight: Any, grid: tuple[int, int]) -> np.ndarray:
    """The circular kernel (H, W, C) of the global filter: irfft2(K)."""
    w = numerics.as_float(weight, "complex_weight")
    return np.fft.irfft2(w[..., 0] + 1j * w[..., 1], s=grid, axes=(0, 1))


def _conv_operator(x: np.ndarray, p: Mapping[str, Any], op: str, grid: tuple[int, int]) -> np.ndarray:
    if op == "dwconv":
        g = layers.depthwise_conv2d(nets.tokens_to_grid(x, grid), numerics.as_float(p["dwconv.weight"], "dwconv"),
                                    None, padding=DWCONV_KERNEL // 2)
        y = nets.grid_to_tokens(g)
    else:
        y = global_filter(x, p["complex_weight"], grid)
    return layers.linear(y, p["proj.weight"], None)


def _e_conv_operator(t: Err, p: Mapping[str, Any], op: str, grid: tuple[int, int]) -> Err:
    """The depthwise conv (nets.e_dwconv) or the global filter as a circular convolution by FFTs
    (refimpl.toeplitz.circulant_product_bound with the kernel irfft2(K), heuristic in the FFT depth as LiSA's;
    input errors through |irfft2(K)| (*) E), then the bias-free projection."""
    if op == "dwconv":
        y = nets.e_tokens(nets.e_dwconv(nets.e_grid(t, grid), p["dwconv.weight"], None))
    else:
        b, n, c = t.value.shape
        kern = _gf_kernel(p["complex_weight"], grid)
        xg = t.value.reshape(b, grid[0], grid[1], c)
        bnd = tz.circulant_product_bound(kern, xg, 2, "rfft")
        err = bnd.k * np.asarray(bnd.scale) + tz.abs_convolution(kern, t.err.reshape(xg.shape), 2)
        y = Err(global_filter(t.value, p["complex_weight"], grid), np.broadcast_to(err, xg.shape).reshape(b, n, c),
                t.depth + bnd.k)
    return common.e_linear(y, p["proj.weight"], None)


def conv_operator_macs(op: str, dim: int, grid: tuple[int, int], *, fft: bool = False) -> dict[str, int]:
    """MACs of one Table 3a operator on an H x W grid: "attn.dwconv" (N C 49) or "attn.spectral" (F C complex
    products of 4 real MACs, F = H (W // 2 + 1); with ``fft`` "attn.fft", the 2 C real transforms of the grid by
    counting.fft_macs), and "attn.proj" (N C^2)."""
    n = grid[0] * grid[1]
    if op == "dwconv":
        out = {"attn.dwconv": counting.depthwise_conv2d_macs(grid, dim, (DWCONV_KERNEL, DWCONV_KERNEL))}
    else:
        out = {"attn.spectral": 4 * grid[0] * (grid[1] // 2 + 1) * dim}
        if fft:
            out["attn.fft"] = counting.fft_macs(grid, real=True, transforms=2 * dim)
    out["attn.proj"] = counting.linear_macs(n, dim, dim)
    return out


def heads(qkv: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v (B, h, N, d) from a fused projection (B, N, 3 h d), laid out (3, h, d) along its last axis."""
    bsz, n_tok, c3 = qkv.shape
    t = qkv.reshape(bsz, n_tok, 3, h, c3 // (3 * h)).transpose(2, 0, 3, 1, 4)
    return t[0], t[1], t[2]


def merge(o: np.ndarray) -> np.ndarray:
    """(B, h, N, d) -> (B, N, h d): the heads joined along the channels."""
    bsz, h, n_tok, c = o.shape
    return o.transpose(0, 2, 1, 3).reshape(bsz, n_tok, h * c)


def rpe_weights(p: Mapping[str, Any], operator: str, sc: lisa.SAConfig) -> dict[str, Any]:
    """The dense RPE tensors of a Table 3b operator (Eq. 2 on the stage grid): "rpe" (N, N) or (h, N, N);
    "ra_tilde" (N, N, c, D) (channel-constant for the two Eq. 5 operators), "rb" (N, N, D), the biases."""
    op, grid = operator, sc.grid
    if op == "selfattn":
        return {}
    if op in ("selfattn_rpe", "sa_eq4"):
        r = lisa.rpe_matrix(p["rpe"], grid, "toeplitz")
        return {"rpe": np.moveaxis(r, -1, 0) if r.ndim == 3 else r}
    ra = lisa.rpe_matrix(p["weight_a"], grid, "toeplitz")
    if op != "sa_eq7":                          # Eq. 5: Ra~_incd = Ra_ind (Fig. 6 evaluates Kb Ra per channel)
        ra = np.broadcast_to(ra[:, :, None, :], ra.shape[:2] + (sc.head_dim, ra.shape[-1]))
    w = {"ra_tilde": ra, "rb": lisa.rpe_matrix(p["weight_b"], grid, "toeplitz"),
         "bias_b": numerics.as_float(p["bias_b"], "bias_b")}
    if op != "sa_eq5":
        w["bias_a"] = numerics.as_float(p["bias_a"], "bias_a")
    return w


def operator(x: np.ndarray, p: Mapping[str, Any], op: str, sc: lisa.SAConfig, taps: dict | None = None) -> np.ndarray:
    """A Table 3b operator on tokens (B, N, C): qkv projection, h heads, the core of op
    (``op``: refimpl.models.lisanet.OPERATORS; ``sc`` its lisanet.sa_config), merge, output projection.
    "lisa_local": ``sc`` is its lisa_local.LocalLiSAConfig; :data:`CONV_OPERATORS`: the block's LiSAConfig (no qkv).
    References: LiSA Eq. 3, 4, 5, 7, 9, Fig. 6, Table 3a-3c."""
    if op in CONV_OPERATORS:
        return _conv_operator(x, p, op, tuple(sc.grid))
    qkv = layers.linear(x, p["qkv.weight"], p.get("qkv.bias"))
    q, k, v = heads(qkv, sc.num_heads)
    w = rpe_weights(p, op, sc) if op != "lisa_local" else {}
    inner: dict | None = {} if taps is not None else None
    if op == "lisa_local":
        out = lisa_local.lisa_local_core(q, k, v, p["weight_a"], p["weight_b"], p["bias_a"], p["bias_b"], sc.grid,
                                         sc.kernel, eps=sc.l2_eps, taps=inner)
    elif op.startswith("selfattn"):
        out = _softmax.softmax_attention(q, k, v, scale=sc.head_dim ** -0.5, bias=w.get("rpe"), taps=inner)
    elif op == "sa_eq4":
        out = lisa.sa_eq4(q, k, v, w["rpe"], eps=sc.l2_eps, taps=inner)
    elif op == "sa_eq5":
        out = lisa.sa_eq6(q, k, v, w["ra_tilde"], w["rb"], w["bias_b"], eps=sc.l2_eps, taps=inner)
    else:
        out = lisa.sa_eq7(q, k, v, w["ra_tilde"], w["rb"], w["bias_a"], w["bias_b"], eps=sc.l2_eps, taps=inner)
    merged = merge(out)
    y = layers.linear(merged, p["proj.weight"], p["proj.bias"])
    if taps is not None:
        taps.update({"qkv": qkv, "merged": merged, **inner})
    return y


def block_part(x: np.ndarray, p: Mapping[str, Any], op: str, part: str, sc: Any, bc: lisa.LiSAConfig,
               taps: dict | None = None) -> np.ndarray:
    """One residual branch of a LiSANet block on tokens (B, N, C) (§5.1, Fig. 3: "LN, attention operator, LN and
    MLP"): "attn" x + op(LN1 x) - LiSA (Eq. 9-10, :func:`refimpl.attention.lisa.lisa_attention` with ``bc``) for
    op "lisa", else the Table 3 operator (:func:`operator` with ``sc``; §5.2: "we only replace our operator") -,
    "mlp" x + MLP(LN2 x).  taps: "ln1", "attn", "resid1" and the operator's under "attn."; "ln2", "mlp", "out"."""
    inner: dict | None = {} if taps is not None else None
    if part == "attn":
        ln = layers.layer_norm(x, p["norm1.weight"], p["norm1.bias"], bc.ln_eps)
        ap = layers.subparams(p, "attn")
        f = lisa.lisa_attention(ln, ap, bc, taps=inner) if op == "lisa" else operator(ln, ap, op, sc, inner)
        names = ("ln1", "attn", "resid1")
    else:
        ln = layers.layer_norm(x, p["norm2.weight"], p["norm2.bias"], bc.ln_eps)
        f = layers.mlp(ln, layers.subparams(p, "mlp"))
        names = ("ln2", "mlp", "out")
    y = x + f
    if taps is not None:
        taps.update(zip(names, (ln, f, y)))
        taps.update({f"attn.{k}": v for k, v in inner.items()})
    return y


def operator_block(x: np.ndarray, p: Mapping[str, Any], op: str, sc: Any, bc: lisa.LiSAConfig,
                   taps: dict | None = None) -> np.ndarray:
    """:func:`refimpl.attention.lisa.lisa_block` with the operator ``op`` ("lisa" included): its parts
    :data:`BLOCK_PARTS` in order (:func:`block_part`), x + op(LN(x)), then + MLP(LN(.)).  Same taps."""
    for part in BLOCK_PARTS:
        x = block_part(x, p, op, part, sc, bc, taps)
    return x


def e_operator(t: Err, p: Mapping[str, Any], op: str, sc: lisa.SAConfig) -> Err:
    """A Table 3b operator with an input error: qkv (common.e_linear); the core by
    refimpl.attention.softmax.softmax_attention_error (self-attention; the depth of common.e_window_attention)
    or lisa.py's tracked SA cores (``_tr_core``, "eq4" / "eq6" / "eq7" with the dense RPEs of
    :func:`rpe_weights`; "lisa_local" by lisa_local._tr_local_core); proj.  :data:`CONV_OPERATORS`:
    :func:`_e_conv_operator`."""
    if op in CONV_OPERATORS:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            return _e_conv_operator(t, p, op, tuple(sc.grid))
    qkv = common.e_linear(t, p["qkv.weight"], p.get("qkv.bias"))
    (q, k, v), (eq, ek, ev) = heads(qkv.value, sc.num_heads), heads(qkv.err, sc.num_heads)
    w = rpe_weights(p, op, sc) if op != "lisa_local" else {}
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if op == "lisa_local":
            weights = {key: numerics.as_float(p[key], key) for key in ("weight_a", "weight_b", "bias_a", "bias_b")}
            o, eo, depth = lisa_local._tr_local_core(q, eq, k, ek, v, ev, sc.grid, sc.kernel, eps=sc.l2_eps,
                                                     weights=weights)
        elif op.startswith("selfattn"):
            scale, bias = sc.head_dim ** -0.5, w.get("rpe")
            o = _softmax.softmax_attention(q, k, v, scale=scale, bias=bias)
            eo = _softmax.softmax_attention_error(q, k, v, scale=scale, bias=bias, err_q=eq, err_k=ek, err_v=ev)
            depth = (sc.head_dim + sc.num_tokens + 2 * config.ELEMENTARY_FUNCTION_ULPS
                     + config.SOFTMAX_EXP_ARG_ROUNDINGS + 4)
        else:
            kind = {"sa_eq4": "eq4", "sa_eq5": "eq6"}.get(op, "eq7")
            o, eo, depth = lisa._tr_core(q, eq, k, ek, v, ev, sc.grid, kind=kind, eps=sc.l2_eps, weights=w)
    return common.e_linear(Err(merge(o), merge(eo), qkv.depth + depth), p["proj.weight"], p["proj.bias"])


def e_block_part(t: Err, p: Mapping[str, Any], op: str, part: str, sc: Any, bc: lisa.LiSAConfig, dtype: Any) -> Err:
    """:func:`block_part` with an input error: LN (common.e_layer_norm, capped), the operator (LiSA by lisa.py's stage
    analysis ``_tr_attention``, private: its public bounds take exact inputs only; same E convention; else
    :func:`e_operator`) or the MLP (common.e_mlp), the residual sum."""
    if part == "mlp":
        y = common.e_layer_norm(t, p["norm2.weight"], p["norm2.bias"], bc.ln_eps, cap=dtype)
        return common.e_add(t, common.e_mlp(y, layers.subparams(p, "mlp")))
    y = common.e_layer_norm(t, p["norm1.weight"], p["norm1.bias"], bc.ln_eps, cap=dtype)
    if op != "lisa":
        return common.e_add(t, e_operator(y, layers.subparams(p, "attn"), op, sc))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        a, ea, k = lisa._tr_attention(y.value, y.err, layers.subparams(p, "attn"), bc, kind="lisa")
    return common.e_add(t, Err(a, ea, y.depth + k))


def e_operator_block(t: Err, p: Mapping[str, Any], op: str, sc: Any, bc: lisa.LiSAConfig, dtype: Any) -> Err:
    """:func:`operator_block` with an input error: :func:`e_block_part` for each of :data:`BLOCK_PARTS`."""
    for part in BLOCK_PARTS:
        t = e_block_part(t, p, op, part, sc, bc, dtype)
    return t
