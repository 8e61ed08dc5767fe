"""PyTorch twin of refimpl.models.ravlt: RAVLT-T/S/B/L (Fan, Huang, He, "Breaking the Low-Rank Dilemma of
Linear Attention", §3.2-3.3, Table 1).

Written in the structure of the released classification model: ``patch_embed.proj`` (four 3x3 convs with
BatchNorm and GELU), ``layers`` of blocks (CPE ``pos``, ``norm1``, attention, ``norm2``, ``ffn``, optional
layer scales ``gamma_1`` / ``gamma_2``) followed by a ``downsample`` (3x3 stride-2 conv ``reduction`` + BN
``norm``), then ``proj`` (1x1 conv), ``norm`` (BN), Swish, average pooling and a 1x1 conv ``head``.
The RALA layers and FFNs are the attention helper's twins (refimpl.twins.modules.rala); the released softmax
layer of the later stages (``VanillaSelfAttention``) is :class:`RopeSoftmaxAttention` below.  state_dict keys
equal refimpl.models.ravlt.param_shapes; unit values (``run_unit``) are channels-first grids.
"""

from __future__ import annotations

import torch
from torch import nn

from refimpl.twins.modules.rala import RALAttention, RAVLTFFN, apply_rope_2d, rope_2d_tables
from refimpl.attention.rala import RALAConfig, RAVLTBlockConfig
from refimpl.models.ravlt import RAVLTNetConfig, block_config, unit_names, unit_parts

CONFIG_TYPES = (RAVLTNetConfig,)

__all__ = ["CONFIG_TYPES", "build", "RAVLT", "RopeSoftmaxAttention", "Block"]


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over C of (B, C, H, W) (the released LayerNorm2d, computed on the channels-last view)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _proj(layout: str, cin: int, cout: int, bias: bool = True) -> nn.Module:
    return nn.Linear(cin, cout, bias=bias) if layout == "tokens" else nn.Conv2d(cin, cout, 1, bias=bias)


class RopeSoftmaxAttention(nn.Module):
    """The released ``VanillaSelfAttention``: fused qkvo projection, LePE on v, softmax(d^-1/2 q k^T) v of the
    RoPE-rotated q and k, + LePE, gated by o, output projection.  forward(x) in the config's layout."""

    def __init__(self, cfg: RALAConfig):
        """The fused qkvo projection (4C rows: Q, K, V, the gate o), the LePE depthwise conv on V when lepe_kernel > 0,
        and the output projection; Linear or 1 x 1 conv by the layout."""
        super().__init__()
        self.cfg = cfg
        c = cfg.dim
        self.qkvo = _proj(cfg.layout, c, 4 * c, cfg.qkv_bias)
        if cfg.lepe_kernel:
            self.lepe = nn.Conv2d(c, c, cfg.lepe_kernel, 1, cfg.lepe_kernel // 2, groups=c)
        self.proj = _proj(cfg.layout, c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The released softmax layer on x in the config's layout ((B, H, W, C) or (B, C, H, W)): softmax(d^-1/2 q k^T)
        v of the 2-D RoPE-rotated q and k, + LePE(v) when configured, times the gate o, projected; returns x's shape."""
        cfg, c, nh = self.cfg, self.cfg.dim, self.cfg.num_heads
        d = c // nh
        if cfg.layout == "channels_first":
            b, _, h, w = x.shape
            p = self.qkvo(x)                                                    # (B, 4C, H, W)
            q, k, v = p[:, :3 * c].reshape(b, 3, nh, d, h * w).permute(1, 0, 2, 4, 3)
            v_grid, o = p[:, 2 * c:3 * c], p[:, 3 * c:]
        else:
            b, h, w, _ = x.shape
            p = self.qkvo(x.reshape(b, h * w, c))                               # (B, N, 4C)
            q, k, v = p[..., :3 * c].reshape(b, h * w, 3, nh, d).permute(2, 0, 3, 1, 4)
            v_grid, o = p[..., 2 * c:3 * c].transpose(1, 2).reshape(b, c, h, w), p[..., 3 * c:]
        cos, sin = rope_2d_tables(h, w, d, cfg.rope_base, x.dtype, x.device)
        q, k = apply_rope_2d(q, cos, sin), apply_rope_2d(k, cos, sin)
        attn = torch.softmax((d ** -0.5) * q @ k.transpose(-1, -2), dim=-1)
        y = attn @ v                                                            # (B, h, N, d)
        if cfg.layout == "channels_first":
            y = y.permute(0, 1, 3, 2).reshape(b, c, h, w)
            if cfg.lepe_kernel:
                y = y + self.lepe(v_grid)
            return self.proj(y * o)
        y = y.transpose(1, 2).reshape(b, h * w, c)
        if cfg.lepe_kernel:
            y = y + self.lepe(v_grid).flatten(2).transpose(1, 2)
        return self.proj(y * o).reshape(b, h, w, c)


class Block(nn.Module):
    """x + pos(x); x + g1 attn(norm1 x); x + g2 ffn(norm2 x), in the block config's layout."""

    def __init__(self, bc: RAVLTBlockConfig, attention: str):
        """The CPE depthwise conv ``pos`` (when cpe_kernel > 0), norm1 and norm2 (LayerNorm over C in either layout),
        the stage's attention (RALA for "rala", :class:`RopeSoftmaxAttention` for "softmax"), the FFN and, with
        layerscale, gamma_1 and gamma_2 (ones)."""
        super().__init__()
        self.bc = bc
        c = bc.attn.dim
        cf = bc.attn.layout == "channels_first"
        if bc.cpe_kernel:
            self.pos = nn.Conv2d(c, c, bc.cpe_kernel, 1, bc.cpe_kernel // 2, groups=c)
        norm = ChannelNorm if cf else nn.LayerNorm
        self.norm1 = norm(c, eps=bc.norm_eps)
        self.attn = RALAttention(bc.attn) if attention == "rala" else RopeSoftmaxAttention(bc.attn)
        self.norm2 = norm(c, eps=bc.norm_eps)
        self.ffn = RAVLTFFN(bc)
        self.layer_scale = bc.layerscale
        if bc.layerscale:
            shape = (1, c, 1, 1) if cf else (c,)
            self.gamma_1 = nn.Parameter(torch.ones(shape))
            self.gamma_2 = nn.Parameter(torch.ones(shape))

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One residual step of the block on x in the block config's layout: "cpe" (x + pos(x)), "attn"
        (x + [gamma_1 *] attn(norm1 x)) or "mlp" (x + [gamma_2 *] ffn(norm2 x)); returns x's shape."""
        if name == "cpe":
            if self.bc.attn.layout == "channels_first":
                return x + self.pos(x)
            return x + self.pos(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        if name == "attn":
            a = self.attn(self.norm1(x))
            return x + (self.gamma_1 * a if self.layer_scale else a)
        if name == "mlp":
            f = self.ffn(self.norm2(x))
            return x + (self.gamma_2 * f if self.layer_scale else f)
        raise ValueError(f"argument 'part': expected 'cpe', 'attn' or 'mlp', got {name!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Its parts in order: x + CPE(x) (with a CPE), then x + gamma_1 attn(norm1 x) and x + gamma_2 ffn(norm2 x)
        (the gammas with layerscale only), in the block config's layout; returns x's shape."""
        for name in (("cpe",) if self.bc.cpe_kernel else ()) + ("attn", "mlp"):
            x = self.part(name, x)
        return x


class PatchEmbed(nn.Module):
    def __init__(self, in_chans: int, dim: int, bn_eps: float):
        super().__init__()
        h = dim // 2
        self.proj = nn.Sequential(
            nn.Conv2d(in_chans, h, 3, 2, 1), nn.BatchNorm2d(h, eps=bn_eps), nn.GELU(),
            nn.Conv2d(h, h, 3, 1, 1), nn.BatchNorm2d(h, eps=bn_eps), nn.GELU(),
            nn.Conv2d(h, h, 3, 1, 1), nn.BatchNorm2d(h, eps=bn_eps), nn.GELU(),
            nn.Conv2d(h, dim, 3, 2, 1), nn.BatchNorm2d(dim, eps=bn_eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class PatchMerging(nn.Module):
    def __init__(self, dim: int, out_dim: int, bn_eps: float):
        super().__init__()
        self.reduction = nn.Conv2d(dim, out_dim, 3, 2, 1)
        self.norm = nn.BatchNorm2d(out_dim, eps=bn_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.reduction(x))


class BasicLayer(nn.Module):
    def __init__(self, cfg: RAVLTNetConfig, i: int):
        super().__init__()
        bc = block_config(cfg, i)
        self.cf = bc.attn.layout == "channels_first"
        self.blocks = nn.ModuleList(Block(bc, cfg.attention(i)) for _ in range(cfg.depths[i]))
        if i < cfg.num_stages - 1:
            self.downsample = PatchMerging(cfg.dims[i], cfg.dims[i + 1], cfg.batch_norm_eps)

    def block(self, j: int, x: torch.Tensor, part: str | None = None) -> torch.Tensor:
        """Block j (or its part ``part``) on a channels-first grid."""
        run = self.blocks[j] if part is None else (lambda t: self.blocks[j].part(part, t))
        if self.cf:
            return run(x)
        return run(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RAVLT(nn.Module):
    """forward(images) -> logits; features(images) -> [stage outputs (B, C_i, H_i, W_i)]; run_unit(name, x)."""

    def __init__(self, cfg: RAVLTNetConfig):
        """The convolutional stem ``patch_embed`` (four 3 x 3 convs with BN and GELU, stride 4 in all), one ``layers``
        entry per stage (its blocks, then the 3 x 3 stride-2 ``downsample`` but after the last), and the head's 1 x 1
        conv ``proj`` to head_proj, BN ``norm`` and 1 x 1 conv ``head``."""
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg.in_chans, cfg.dims[0], cfg.batch_norm_eps)
        self.layers = nn.ModuleList(BasicLayer(cfg, i) for i in range(cfg.num_stages))
        hp = int(cfg.head_proj)
        self.proj = nn.Conv2d(cfg.dims[-1], hp, 1)
        self.norm = nn.BatchNorm2d(hp, eps=cfg.batch_norm_eps)
        self.head = nn.Conv2d(hp, cfg.num_classes, 1)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.proj(x))
        x = x * torch.sigmoid(x)
        return self.head(x.mean(dim=(2, 3), keepdim=True)).flatten(1)

    def _backbone(self, images: torch.Tensor):
        x = self.patch_embed(images)
        feats = []
        for layer in self.layers:
            for j in range(len(layer.blocks)):
                x = layer.block(j, x)
            feats.append(x)
            if hasattr(layer, "downsample"):
                x = layer.downsample(x)
        return feats

    def run_unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The unit ``name`` of refimpl.models.ravlt.unit_names on a channels-first grid (images for "stem")."""
        if name not in unit_names(self.cfg):
            raise ValueError(f"unknown unit {name!r}")
        if name == "stem":
            return self.patch_embed(x)
        if name == "head":
            return self._head(x)
        parts = name.split(".")
        layer = self.layers[int(parts[1])]
        if parts[2] == "downsample":
            return layer.downsample(x)
        return layer.block(int(parts[3]), x)

    def run_unit_part(self, name: str, part: str, x: torch.Tensor) -> torch.Tensor:
        """Part ``part`` ("cpe", "attn" or "mlp": refimpl.models.ravlt.unit_parts) of the block unit ``name``
        ("layers.i.blocks.j") on a channels-first grid."""
        parts = unit_parts(self.cfg, name)
        if part not in parts:
            raise ValueError(f"argument 'part': unit {name!r} has parts {parts}, got {part!r}")
        p = name.split(".")
        return self.layers[int(p[1])].block(int(p[3]), x, part)

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The reference's ``features``: each stage's output before its downsample, channels-first
        (B, C_i, H_i, W_i)."""
        return self._backbone(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) of images (B, in_chans, H, W): the stages, then proj, BN, Swish, average pooling and
        the 1 x 1 conv head."""
        return self._head(self._backbone(images)[-1])


def build(cfg: RAVLTNetConfig) -> nn.Module:
    """The twin of a RAVLT network config."""
    if not isinstance(cfg, RAVLTNetConfig):
        raise TypeError(f"argument 'cfg': expected RAVLTNetConfig, got {type(cfg).__name__}")
    return RAVLT(cfg)

