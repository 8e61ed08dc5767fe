"""LiSA's Table 3b operators inside a LiSANet block: self-attention (with or without Toeplitz RPEs, one or h of
them) and the structure-aware attentions of Eq. 4, 5 and 7, each replacing LiSA in the block (§5.2: "we only
replace our operator with others in the LiSA blocks"), with their error propagation.

Layer: networks.  Used by refimpl.models.lisanet (its ``operator`` field, :data:`refimpl.models.lisanet.OPERATORS`),
which passes the operator's :class:`refimpl.attention.lisa.SAConfig` (``lisanet.sa_config``) and the block's
:class:`refimpl.attention.lisa.LiSAConfig` (``lisanet.block_config``); this module imports nothing from it.

References: LiSA (../shared/seeds/004_*.txt) Eq. 2-5, 7, Fig. 6, Table 3b.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics
from ..attention import lisa
from ..attention import softmax as _softmax
from . import _netparts as nets
from . import common
from .common import Err

__all__ = ["heads", "merge", "rpe_weights", "operator", "operator_block", "e_operator", "e_operator_block"]


def heads(qkv: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bsz, n_tok, c3 = qkv.shape
    t = qkv.reshape(bsz, n_tok, 3, h, c3 // (3 * h)).transpose(2, 0, 3, 1, 4)
    return t[0], t[1], t[2]


def merge(o: np.ndarray) -> np.ndarray:
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
    References: LiSA Eq. 3, 4, 5, 7, Fig. 6, Table 3b."""
    qkv = layers.linear(x, p["qkv.weight"], p.get("qkv.bias"))
    q, k, v = heads(qkv, sc.num_heads)
    w = rpe_weights(p, op, sc)
    inner: dict | None = {} if taps is not None else None
    if op.startswith("selfattn"):
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


def operator_block(x: np.ndarray, p: Mapping[str, Any], op: str, sc: lisa.SAConfig, bc: lisa.LiSAConfig,
                   taps: dict | None = None) -> np.ndarray:
    """:func:`refimpl.attention.lisa.lisa_block` with the operator ``op``: x + op(LN(x)), then
    + MLP(LN(.)) (§5.2: "we only replace our operator with others in the LiSA blocks").  Same taps."""
    ln1 = layers.layer_norm(x, p["norm1.weight"], p["norm1.bias"], bc.ln_eps)
    inner: dict | None = {} if taps is not None else None
    a = operator(ln1, layers.subparams(p, "attn"), op, sc, inner)
    y = x + a
    ln2 = layers.layer_norm(y, p["norm2.weight"], p["norm2.bias"], bc.ln_eps)
    m = layers.mlp(ln2, layers.subparams(p, "mlp"))
    out = y + m
    if taps is not None:
        taps.update({"ln1": ln1, "attn": a, "resid1": y, "ln2": ln2, "mlp": m, "out": out})
        taps.update({f"attn.{k}": v for k, v in inner.items()})
    return out


def e_operator(t: Err, p: Mapping[str, Any], op: str, sc: lisa.SAConfig) -> Err:
    """A Table 3b operator with an input error: qkv (common.e_linear); the core by
    refimpl.attention.softmax.softmax_attention_error (self-attention; the depth of common.e_window_attention)
    or lisa.py's tracked SA cores (``_tr_core``, "eq4" / "eq6" / "eq7" with the dense RPEs of
    :func:`rpe_weights`); proj."""
    qkv = common.e_linear(t, p["qkv.weight"], p.get("qkv.bias"))
    (q, k, v), (eq, ek, ev) = heads(qkv.value, sc.num_heads), heads(qkv.err, sc.num_heads)
    w = rpe_weights(p, op, sc)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if op.startswith("selfattn"):
            scale, bias = sc.head_dim ** -0.5, w.get("rpe")
            o = _softmax.softmax_attention(q, k, v, scale=scale, bias=bias)
            eo = _softmax.softmax_attention_error(q, k, v, scale=scale, bias=bias, err_q=eq, err_k=ek, err_v=ev)
            depth = (sc.head_dim + sc.num_tokens + 2 * config.ELEMENTARY_FUNCTION_ULPS
                     + config.SOFTMAX_EXP_ARG_ROUNDINGS + 4)
        else:
            kind = {"sa_eq4": "eq4", "sa_eq5": "eq6"}.get(op, "eq7")
            o, eo, depth = lisa._tr_core(q, eq, k, ek, v, ev, sc.grid, kind=kind, eps=sc.l2_eps, weights=w)
    return common.e_linear(Err(merge(o), merge(eo), qkv.depth + depth), p["proj.weight"], p["proj.bias"])


def e_operator_block(t: Err, p: Mapping[str, Any], op: str, sc: lisa.SAConfig, bc: lisa.LiSAConfig,
                     dtype: Any) -> Err:
    """:func:`operator_block` with an input error (as refimpl.models.lisanet's ``_e_block``)."""
    y = nets.e_layer_norm(t, p["norm1.weight"], p["norm1.bias"], bc.ln_eps, dtype)
    a = e_operator(y, layers.subparams(p, "attn"), op, sc)
    x1 = common.e_add(t, a)
    m = common.e_mlp(nets.e_layer_norm(x1, p["norm2.weight"], p["norm2.bias"], bc.ln_eps, dtype),
                     layers.subparams(p, "mlp"))
    return common.e_add(x1, m)
