"""PyTorch twin of refimpl.models.rala_variants: RALA in DeiT-T, Swin-T and Swin-S (RALA Table 8).

The networks are FLatten's twins (refimpl/twins/models/flatten.py: DeiT without a class token, mean-pooled;
Swin stages with patch merging) with RALA's layer (refimpl.twins.modules.rala.RALAttention, the twin of
refimpl.attention.rala.rala_attention) in place of the focused attention: the stem, head, unit and feature
methods are inherited, only the blocks differ.  state_dict keys equal refimpl.models.rala_variants.param_shapes.
"""

from __future__ import annotations

import torch
from torch import nn

from refimpl.twins.models.flatten import DeiT, FlattenDeiT, FlattenSwin, PatchEmbed
from refimpl.twins.modules.layers import Mlp, PatchMerging
from refimpl.twins.modules.rala import RALAttention
from refimpl.twins.modules.softmax import WindowAttention
from refimpl.attention.rala import RALAConfig
from refimpl.models.rala_variants import RALADeiTConfig, RALASwinConfig

CONFIG_TYPES = (RALADeiTConfig, RALASwinConfig)

__all__ = ["CONFIG_TYPES", "build", "RALADeiT", "RALASwin"]


def _rala_on_grid(attn: RALAttention, cfg: RALAConfig, y: torch.Tensor) -> torch.Tensor:
    """RALA on a channels-last grid (B, H, W, C), in the layer's own layout (as the reference)."""
    if cfg.layout == "tokens":
        return attn(y)
    return attn(y.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class Block(nn.Module):
    """x + attn(LN1 x), x + MLP(LN2 x); attn RALA (on the DeiT grid or a Swin stage's whole grid) or Swin's
    shifted-window softmax attention."""

    def __init__(self, c: int, hidden: int, eps: float, *, rala: RALAConfig | None = None,
                 grid: tuple[int, int] | None = None, window: WindowAttention | None = None):
        super().__init__()
        self.acfg, self.grid = rala, grid
        self.norm1 = nn.LayerNorm(c, eps=eps)
        self.attn = RALAttention(rala) if rala is not None else window
        self.norm2 = nn.LayerNorm(c, eps=eps)
        self.mlp = Mlp(c, hidden)

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One residual branch: "attn" (x + attn(LN1 x)) or "mlp" (x + MLP(LN2 x))."""
        if name == "mlp":
            return x + self.mlp(self.norm2(x))
        y = self.norm1(x)
        if self.acfg is None:
            return x + self.attn(y)
        if y.dim() == 3:                                   # DeiT tokens (B, N, C) on the patch grid
            b, n, c = y.shape
            return x + _rala_on_grid(self.attn, self.acfg, y.reshape(b, *self.grid, c)).reshape(b, n, c)
        return x + _rala_on_grid(self.attn, self.acfg, y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part("mlp", self.part("attn", x))


class RALADeiT(FlattenDeiT):
    """DeiT-T with RALA, no class token: FLatten-DeiT's stem (patch embedding + positional embedding), head
    (LayerNorm, mean over the tokens, linear) and unit methods, RALA blocks."""

    def __init__(self, cfg: RALADeiTConfig):
        """FLatten-DeiT's frame (no class token) around ``cfg.depth`` RALA blocks on the patch grid."""
        acfg = cfg.attention_config()
        DeiT.__init__(self, cfg, lambda: (Block(cfg.embed_dim, cfg.hidden, cfg.layer_norm_eps, rala=acfg, grid=cfg.grid)
                                          for _ in range(cfg.depth)), cls_token=False)


def _swin_stage(cfg: RALASwinConfig, i: int) -> nn.Module:
    stage = nn.Module()
    c, (ws, sh) = cfg.stage_dim(i), cfg.stage_windows[i]
    blocks = []
    for j in range(cfg.depths[i]):
        if cfg.attn_types[i] == "L":
            blocks.append(Block(c, cfg.hidden(i), cfg.layer_norm_eps, rala=cfg.attention_config(i)))
        else:
            opts = cfg.window_options
            opts.pop("shift", None)
            win = WindowAttention(c, cfg.num_heads[i], ws, shift=sh if j % 2 else 0, pad=True, qkv_bias=cfg.qkv_bias,
                                  **opts)
            blocks.append(Block(c, cfg.hidden(i), cfg.layer_norm_eps, window=win))
    stage.blocks = nn.ModuleList(blocks)
    stage.downsample = PatchMerging(c, eps=cfg.layer_norm_eps) if i < cfg.n_stages - 1 else None
    return stage


class RALASwin(FlattenSwin):
    """Swin with RALA in the "L" stages: FLatten-Swin's stem (patch embedding + LN), head (LN, global average
    pool, linear), stages and unit methods, RALA / window-attention blocks."""

    def __init__(self, cfg: RALASwinConfig):
        """FLatten-Swin's frame (patch embedding + LN, stages, LN, head) with RALA blocks in the "L" stages, Swin's
        shifted-window softmax blocks (the shift on odd blocks) in the "S" stages, patch merging between stages."""
        nn.Module.__init__(self)
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg.in_chans, cfg.embed_dim, cfg.patch_size, norm_eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(_swin_stage(cfg, i) for i in range(cfg.n_stages))
        cl = cfg.stage_dim(cfg.n_stages - 1)
        self.norm = nn.LayerNorm(cl, eps=cfg.layer_norm_eps)
        self.head = nn.Linear(cl, cfg.num_classes)


def build(cfg: RALADeiTConfig | RALASwinConfig) -> nn.Module:
    """The twin of a RALA-DeiT / RALA-Swin config."""
    if isinstance(cfg, RALADeiTConfig):
        return RALADeiT(cfg)
    if isinstance(cfg, RALASwinConfig):
        return RALASwin(cfg)
    raise TypeError(f"argument 'cfg': expected RALADeiTConfig or RALASwinConfig, got {type(cfg).__name__}")
