"""DeiT's network frame, shared by the DeiT networks (Castling-DeiT, L2ViT-DeiT, RALA-DeiT, FLatten-DeiT): the
stem and the head with their parameter shapes and running error analysis, the unit names, the units' inputs and
the feature map.  A network supplies its blocks and declares its units to the interpreter of
:mod:`refimpl.models._netparts` (run_stages, bound_network, bound_unit, run_part, bound_part), which runs them.

``cfg`` is any config with embed_dim, depth, in_chans, img_size, patch_size, num_classes, layer_norm_eps and
grid.  With a class token (DeiT: Castling-DeiT, L2ViT-DeiT) the head reads the class token; without one
(FLatten-DeiT's layout, RALA's DeiT-T setting) the positional embedding covers the N patch tokens and the head
mean-pools them.

References: DeiT (Touvron et al. 2021).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import layers, numerics
from . import common
from .common import Err

__all__ = ["DeiTGeometry", "DeiTClassTokenGeometry", "deit_stem_shapes", "block_shapes", "deit_head_shapes",
           "deit_stem", "deit_head", "e_deit_stem", "e_deit_head",
           "deit_unit_names", "deit_unit_input", "deit_feature_map"]


class DeiTGeometry:
    """The derived sizes of a DeiT config (a mixin of the frozen config dataclasses; no fields): the patch
    grid and the MLP's hidden width."""

    @property
    def grid(self) -> tuple[int, int]:
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size

    @property
    def hidden(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)


class DeiTClassTokenGeometry(DeiTGeometry):
    """:class:`DeiTGeometry` with a class token: T = H W / patch^2 + 1 tokens."""

    @property
    def tokens(self) -> int:
        return self.grid[0] * self.grid[1] + 1


def deit_stem_shapes(cfg: Any, *, cls_token: bool) -> dict[str, tuple[int, ...]]:
    """The stem's entries: the patch embedding, the class token (if any) and the positional embedding."""
    c, p = cfg.embed_dim, cfg.patch_size
    n = (cfg.img_size[0] // p) * (cfg.img_size[1] // p) + (1 if cls_token else 0)
    s: dict[str, tuple[int, ...]] = {"patch_embed.proj.weight": (c, cfg.in_chans, p, p), "patch_embed.proj.bias": (c,)}
    if cls_token:
        s["cls_token"] = (1, 1, c)
    s["pos_embed"] = (1, n, c)
    return s


def block_shapes(prefix: str, c: int, hidden: int, attn: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """A pre-norm block's entries under ``prefix``: norm1, the attention's entries ``attn`` (keys relative to
    "attn"), norm2, the MLP (C -> hidden -> C)."""
    s = dict(common.ln_shapes(f"{prefix}.norm1", c))
    s.update({f"{prefix}.attn.{k}": tuple(v) for k, v in attn.items()})
    s.update(common.ln_shapes(f"{prefix}.norm2", c))
    s.update(common.mlp_shapes(f"{prefix}.mlp", c, hidden))
    return s


def deit_head_shapes(cfg: Any) -> dict[str, tuple[int, ...]]:
    """The head's entries: the final LayerNorm and the classifier."""
    s = dict(common.ln_shapes("norm", cfg.embed_dim))
    s.update({"head.weight": (cfg.num_classes, cfg.embed_dim), "head.bias": (cfg.num_classes,)})
    return s


def deit_stem(params: Mapping[str, Any], images: Any, cfg: Any, *, cls_token: bool) -> np.ndarray:
    """Images (B, in_chans, H, W) -> tokens (B, T, C): the patch embedding (a patch x patch conv, stride patch),
    the tokens row-major, the class token first (if any), + the positional embedding.  References: DeiT."""
    images = common.check_images(images, cfg.in_chans, cfg.img_size)
    y = common.patch_embed(images, params["patch_embed.proj.weight"], params["patch_embed.proj.bias"],
                           cfg.patch_size)
    b, c, gh, gw = y.shape
    tok = y.reshape(b, c, gh * gw).transpose(0, 2, 1)
    if cls_token:
        cls = np.broadcast_to(numerics.as_float(params["cls_token"], "cls_token"), (b, 1, c))
        tok = np.concatenate([cls, tok], axis=1)
    return tok + numerics.as_float(params["pos_embed"], "pos_embed")


def deit_head(params: Mapping[str, Any], x: np.ndarray, cfg: Any, *, cls_token: bool) -> np.ndarray:
    """Tokens (B, T, C) -> logits: LayerNorm, then the class token (DeiT) or the mean over the tokens (no class
    token), then the classifier."""
    if cls_token:
        y = layers.layer_norm(x[:, 0], params["norm.weight"], params["norm.bias"], cfg.layer_norm_eps)
    else:
        y = np.mean(layers.layer_norm(x, params["norm.weight"], params["norm.bias"], cfg.layer_norm_eps), axis=1)
    return layers.linear(y, params["head.weight"], params["head.bias"])


def e_deit_stem(params: Mapping[str, Any], t: Err, cfg: Any, *, cls_token: bool) -> Err:
    """:func:`deit_stem` with the running error analysis (the class token is exact)."""
    images = common.check_images(t.value, cfg.in_chans, cfg.img_size)
    y = common.e_conv2d(Err(images, t.err, t.depth), params["patch_embed.proj.weight"],
                        params["patch_embed.proj.bias"], stride=cfg.patch_size)
    b, c, gh, gw = y.value.shape
    cls = np.broadcast_to(numerics.as_float(params["cls_token"], "cls_token"), (b, 1, c)) if cls_token else None

    def tok(a, first):
        a = a.reshape(b, c, gh * gw).transpose(0, 2, 1)
        return a if first is None else np.concatenate([first, a], axis=1)

    x = Err(tok(y.value, cls), tok(y.err, None if cls is None else np.zeros_like(cls)), y.depth)
    return common.e_add(x, common.e_exact(params["pos_embed"]))


def e_deit_head(params: Mapping[str, Any], t: Err, cfg: Any, dtype: Any, *, cls_token: bool,
                capped: bool = True) -> Err:
    """:func:`deit_head` with the running error analysis; the final LayerNorm's error through
    :func:`refimpl.models.common.e_layer_norm` with its output cap in ``dtype`` or, ``capped=False``, the
    first-order propagation alone."""
    eps = cfg.layer_norm_eps

    def norm(a: Err) -> Err:
        return common.e_layer_norm(a, params["norm.weight"], params["norm.bias"], eps, cap=dtype if capped else None)

    if cls_token:
        y = norm(Err(t.value[:, 0], t.err[:, 0], t.depth))
    else:
        y = common.e_mean(norm(t), axis=1)
    return common.e_linear(y, params["head.weight"], params["head.bias"])


def deit_unit_names(cfg: Any) -> list[str]:
    """"stem", "blocks.0" ... "blocks.{depth - 1}", "head"."""
    return ["stem"] + [f"blocks.{i}" for i in range(cfg.depth)] + ["head"]


def deit_unit_input(name: str, x: Any, cfg: Any, *, cls_token: bool) -> np.ndarray:
    """The checked input of unit ``name`` (or of a block's part): images (B, in_chans, H, W), (H, W) = cfg.img_size,
    for "stem", else tokens (B, T, C), T = N + 1 with a class token, (B, N, C) without (N = the patch grid's)."""
    if name == "stem":
        return common.check_images(x, cfg.in_chans, cfg.img_size)
    x = numerics.as_float(x, "x")
    n = cfg.grid[0] * cfg.grid[1]
    if cls_token:
        numerics.check_shapes(x=(x, "B T C"), sizes={"T": n + 1, "C": cfg.embed_dim})
    else:
        numerics.check_shapes(x=(x, "B N C"), sizes={"N": n, "C": cfg.embed_dim})
    return x


def deit_feature_map(name: str, y: np.ndarray, cfg: Any, *, cls_token: bool) -> np.ndarray | None:
    """The single stage's feature map (B, C, H, W) after the last block (its patch tokens on the grid, the class
    token dropped), else None."""
    if name != f"blocks.{cfg.depth - 1}":
        return None
    b, _, c = y.shape
    return (y[:, 1:] if cls_token else y).transpose(0, 2, 1).reshape(b, c, *cfg.grid)
