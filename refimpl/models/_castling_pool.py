"""Castling-ViT's post-Q pooling attention (§3.1, Table 1; Eq. 9), the part Castling-LeViT
(:mod:`refimpl.models.castling_levit`, its shrink blocks) and Castling-MViTv2
(:mod:`refimpl.models.castling_mvitv2`, every block) share: MViTv2's query pooling (a 3x3 depthwise conv shared
by the heads, then LayerNorm over the head dim), Eq. 9's core for the pooled queries, their running errors and
the core's multiply-accumulates.

Shapes: B batch, h heads, (H, W) the input grid, N = H W tokens (row-major), N' the pooled positions, d the
head dim.  Per-head tensors are (B, h, N, d).

castling_core takes self-attention shapes (N queries = N keys).  Every term of the core is row-wise in Q (the
constant, Q^ (K^^T V), the token conv at the query's position, the official output l2), so the pooled queries
are evaluated as the rows at the stride-2 positions of a full-size query matrix (:func:`embed_rows`; the other
rows hold the unpooled projections and are discarded, :func:`kept`): exactly the pooled-query core.

Layer: networks (imports attention.angular, layers, numerics, models.common, models._netparts and
models.counting; no family module).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics
from ..attention.angular import CastlingConfig, castling_core, castling_core_bound
from . import common, counting
from .common import Err

__all__ = ["merge_heads", "kept", "embed_rows", "pool_conv", "pool_q", "core_args", "pooled_core", "e_core",
           "e_pooled_core", "e_pool_q", "core_macs", "POOL_KERNEL"]

#: The query pooling conv's kernel (MViTv2: 3x3, padding 1).
POOL_KERNEL = config.MVITV2_POOL_KERNEL


def merge_heads(t: np.ndarray) -> np.ndarray:
    """(B, h, N, d) -> (B, N, h d), heads concatenated per token."""
    b, h, n, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def kept(hw: tuple[int, int]) -> np.ndarray:
    """Flat indices of the stride-2 grid positions (row-major): the rows the pooled queries stand for (the
    centres of their pooling windows)."""
    return np.arange(hw[0] * hw[1]).reshape(hw)[::2, ::2].reshape(-1)


def embed_rows(full: np.ndarray, rows: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """``full`` (B, h, N, d) with its rows at the stride-2 positions replaced by ``rows`` (B, h, N', d)."""
    out = np.array(full, copy=True)
    out[..., kept(hw), :] = rows
    return out


def pool_conv(q: np.ndarray, w: Any, hw: tuple[int, int], stride: int) -> np.ndarray:
    """MViTv2's query pooling conv: (B, h, N, d) -> (B, h, N', d), a 3x3 depthwise conv (padding 1, no bias) of
    stride 1 or 2 on every head's (d, H, W) image with the same (d, 1, 3, 3) filters for all heads."""
    b, h, n, d = q.shape
    img = q.transpose(0, 1, 3, 2).reshape(b * h, d, hw[0], hw[1])
    out = layers.depthwise_conv2d(img, w, None, stride=stride, padding=POOL_KERNEL // 2)
    return out.reshape(b, h, d, -1).transpose(0, 1, 3, 2)


def pool_q(q: np.ndarray, p: Mapping[str, Any], hw: tuple[int, int], stride: int, eps: float) -> np.ndarray:
    """The pooled queries LayerNorm_d(pool_conv(q)) (keys "attn.pool_q.weight", "attn.norm_q.{weight,bias}")."""
    return layers.layer_norm(pool_conv(q, p["attn.pool_q.weight"], hw, stride), p["attn.norm_q.weight"],
                             p["attn.norm_q.bias"], eps)


def core_args(p: Mapping[str, Any]) -> dict[str, Any]:
    """The token conv's parameters of a block's attention ("attn.dconv.*", absent without the conv)."""
    return {"conv_weight": p.get("attn.dconv.weight"), "conv_bias": p.get("attn.dconv.bias")}


def pooled_core(qf: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, acfg: CastlingConfig,
                p: Mapping[str, Any], hw: tuple[int, int]) -> np.ndarray:
    """Eq. 9 for the pooled queries ``q`` (B, h, N', d) against all N keys: castling_core on the full-size
    query matrix ``qf`` with the pooled rows embedded, its stride-2 rows kept."""
    return castling_core(embed_rows(qf, q, hw), k, v, acfg, hw=hw, **core_args(p))[..., kept(hw), :]


def e_core(q: Err, k: Err, v: Err, acfg: CastlingConfig, p: Mapping[str, Any], hw: tuple[int, int],
           dtype: Any) -> Err:
    """castling_core with the q, k, v errors (castling_core_bound: E = its scale times its k)."""
    val = castling_core(q.value, k.value, v.value, acfg, hw=hw, **core_args(p))
    bnd = castling_core_bound(q.value, k.value, v.value, acfg, dtype=dtype, hw=hw, err_q=q.err, err_k=k.err,
                              err_v=v.err, **core_args(p))
    return Err(val, np.asarray(bnd.scale) * bnd.k, max(q.depth, k.depth, v.depth) + int(math.ceil(bnd.k)))


def e_pooled_core(qf: Err, q: Err, k: Err, v: Err, acfg: CastlingConfig, p: Mapping[str, Any],
                  hw: tuple[int, int], dtype: Any) -> Err:
    """:func:`pooled_core` with its errors: :func:`e_core` on the embedded rows, the stride-2 rows kept."""
    qe = Err(embed_rows(qf.value, q.value, hw), embed_rows(qf.err, q.err, hw), max(qf.depth, q.depth))
    core = e_core(qe, k, v, acfg, p, hw, dtype)
    rows = kept(hw)
    return Err(core.value[..., rows, :], core.err[..., rows, :], core.depth)


def e_pool_q(q: Err, p: Mapping[str, Any], hw: tuple[int, int], stride: int, eps: float, dtype: Any) -> Err:
    """Query pooling with its error: the conv as _netparts.e_dwconv's rule (E = conv(E_q, |w|) + 9 conv(|q|, |w|),
    9 taps, no bias), then LayerNorm over d (common.e_layer_norm, capped)."""
    w = numerics.as_float(p["attn.pool_q.weight"], "pool_q.weight")
    y = pool_conv(q.value, w, hw, stride)
    e = pool_conv(q.err, np.abs(w), hw, stride) + POOL_KERNEL * POOL_KERNEL * pool_conv(np.abs(q.value), np.abs(w),
                                                                                          hw, stride)
    return common.e_layer_norm(Err(y, e, q.depth + POOL_KERNEL * POOL_KERNEL), p["attn.norm_q.weight"],
                             p["attn.norm_q.bias"], eps, cap=dtype)


def core_macs(acfg: CastlingConfig, n_q: int, n_k: int, sparse: bool) -> dict[str, int]:
    """The core's multiply-accumulates for n_q queries against n_k keys (counting.py's convention): K^^T V and
    Q^ (K^^T V) over the series features (the similarity-sum normaliser's product), the token or grid conv at
    the n_q query positions, the auxiliary branch when ``sparse``."""
    h, d = acfg.num_heads, acfg.head_dim
    feat = sum(d ** (2 * kk + 1) for kk in range(acfg.order + 1))
    out = {"core": counting.matmul_macs(h, feat, n_k, d) + counting.matmul_macs(h, n_q, feat, d)
           + (counting.matmul_macs(h, n_q, feat, 1) if acfg.normaliser == "similarity_sum" else 0)}
    if acfg.conv == "tokens1d":
        out["conv"] = h * n_q * d * acfg.conv_kernel
    elif acfg.conv == "grid2d":
        out["conv"] = h * n_q * d * acfg.conv_kernel ** 2
    if sparse:
        out["sparse"] = counting.softmax_attention_macs(h, n_q, n_k, d)
    return out
