"""PyTorch twin of refimpl.models.flatten_cswin: FLatten-CSwin-T/S/B.

Written as an ordinary CSwin-style nn.Module in the structure of the released code (a ``stage1_conv_embed``
Sequential of conv, token rearrangement and LayerNorm; ``stage{i}`` ModuleLists of blocks with a block-level
``qkv`` and ``proj`` and per-branch attention modules ``attns.{b}``; ``merge{i}`` conv + LayerNorm; ``norm``,
``head``), from the CSwin and FLatten papers and refimpl's configs, not from the NumPy reference: windows by
view/permute of the channels-first image (the reference uses refimpl.layers.window_partition on channels-last
grids), softmax attention with Q pre-scaled as written in CSwin Eq. 1, the focused features and normaliser of
refimpl/twins/modules/focused (``focused_function``, ``attend``), LePE and the DWC as ``nn.Conv2d``.
state_dict keys equal refimpl.models.flatten_cswin.param_shapes (= the released names).  Tokens (B, N, C)
between units; ``features`` returns channels-first maps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from refimpl.twins.modules.focused import attend, focused_function
from refimpl.twins.modules.layers import Mlp
from refimpl import config as _config
from refimpl.models.flatten_cswin import FlattenCSwinConfig

CONFIG_TYPES = (FlattenCSwinConfig,)

__all__ = ["CONFIG_TYPES", "build", "FlattenCSwin"]


def img2windows(x: torch.Tensor, hw: tuple[int, int], win: tuple[int, int]) -> torch.Tensor:
    """Tokens (B, N, C) of an H x W grid -> windows (B nW, wh ww, C), windows and tokens row-major."""
    b, _, c = x.shape
    (h, w), (wh, ww) = hw, win
    g = x.transpose(1, 2).reshape(b, c, h // wh, wh, w // ww, ww)
    return g.permute(0, 2, 4, 3, 5, 1).reshape(-1, wh * ww, c)


def windows2img(x: torch.Tensor, hw: tuple[int, int], win: tuple[int, int]) -> torch.Tensor:
    """Inverse of :func:`img2windows`: (B nW, wh ww, C) -> (B, N, C)."""
    (h, w), (wh, ww) = hw, win
    c = x.shape[-1]
    g = x.reshape(-1, h // wh, w // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return g.reshape(-1, h * w, c)


class Tokens(nn.Module):
    """(B, C, H, W) -> (B, H W, C) (the released ``Rearrange('b c h w -> b (h w) c')``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(2).transpose(1, 2)


class LePEAttention(nn.Module):
    """CSwin's attention in one branch's windows: softmax((Q d^-1/2) K^T) V + LePE(V) (CSwin Eq. 1, §3.3)."""

    def __init__(self, dim: int, heads: int, win: tuple[int, int]):
        super().__init__()
        k = _config.CSWIN_LEPE_KERNEL
        self.heads, self.win = heads, win
        self.get_v = nn.Conv2d(dim, dim, k, padding=k // 2, groups=dim)

    def lepe(self, v: torch.Tensor) -> torch.Tensor:
        bw, n, c = v.shape
        return self.get_v(v.transpose(1, 2).reshape(bw, c, *self.win)).reshape(bw, c, n).transpose(1, 2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        bw, n, c = q.shape
        h, d = self.heads, c // self.heads
        qh, kh, vh = (t.reshape(bw, n, h, d).transpose(1, 2) for t in (q, k, v))
        attn = torch.softmax((qh * d ** -0.5) @ kh.transpose(-2, -1), dim=-1)
        return (attn @ vh).transpose(1, 2).reshape(bw, n, c) + self.lepe(v)


class FocusedLinearAttention(LePEAttention):
    """FLatten's focused linear attention in one branch's windows (no projections: CSwin's qkv and proj belong
    to the block): [+ positional encoding on K], phi_p features (FLatten Eq. 6 and the preset's departures),
    the normalised attention (Eq. 4 / the released normaliser), + DWC(V) (Eq. 10-12) + LePE(V)."""

    def __init__(self, dim: int, heads: int, win: tuple[int, int], cfg):
        super().__init__(dim, heads, win)
        self.cfg = cfg
        d, kk = dim // heads, cfg.kernel_size
        nb = d if cfg.dwc_shared else dim
        self.dwc = nn.Conv2d(nb, nb, kk, padding=kk // 2, groups=nb)
        if cfg.learnable_scale:
            self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        if cfg.positional_encoding:
            self.positional_encoding = nn.Parameter(torch.zeros(1, win[0] * win[1], dim))

    def _phi(self, t: torch.Tensor) -> torch.Tensor:
        cfg, h = self.cfg, self.heads
        a = F.relu(t)
        if cfg.relu_eps:
            a = a + cfg.relu_eps
        if cfg.learnable_scale:
            a = a / F.softplus(self.scale)
        b, n, c = a.shape
        if cfg.norm_scope == "token":
            return focused_function(a, cfg.p, -1, cfg.power_scaling).reshape(b, n, h, c // h).transpose(1, 2)
        return focused_function(a.reshape(b, n, h, c // h).transpose(1, 2), cfg.p, -1, cfg.power_scaling)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cfg, h = self.cfg, self.heads
        if cfg.positional_encoding:
            k = k + self.positional_encoding
        bw, n, c = v.shape
        d = c // h
        vh = v.reshape(bw, n, h, d).transpose(1, 2)
        att = attend(self._phi(q), self._phi(k), vh, cfg.normaliser, cfg.eps, "linear")
        grid = vh.transpose(-2, -1).reshape(bw * h, d, *self.win)
        dw = self.dwc(grid if cfg.dwc_shared else grid.reshape(bw, c, *self.win))
        dw = dw.reshape(bw, h, d, n).transpose(-2, -1)
        return (att + dw).transpose(1, 2).reshape(bw, n, c) + self.lepe(v)


class CSWinBlock(nn.Module):
    """x + proj(cross-shaped attention(LN1 x)), x + MLP(LN2 x)."""

    def __init__(self, cfg: FlattenCSwinConfig, i: int):
        super().__init__()
        c = cfg.stage_dim(i)
        self.hw, self.c = cfg.stage_grids[i], c
        self.wins = cfg.branch_windows(i)
        cb, hb = cfg.branch_dims(i)
        self.qkv = nn.Linear(c, 3 * c, bias=cfg.qkv_bias)
        self.norm1 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.proj = nn.Linear(c, c)
        if cfg.attn_types[i] == "L":
            fcfg = cfg.attention_config(i)
            self.attns = nn.ModuleList(FocusedLinearAttention(cb, hb, w, fcfg) for w in self.wins)
        else:
            self.attns = nn.ModuleList(LePEAttention(cb, hb, w) for w in self.wins)
        self.mlp = Mlp(c, cfg.hidden(i))
        self.norm2 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        q, k, v = qkv[..., :self.c], qkv[..., self.c:2 * self.c], qkv[..., 2 * self.c:]
        cb = self.c // len(self.wins)
        outs = []
        for b, (mod, win) in enumerate(zip(self.attns, self.wins)):
            sl = slice(b * cb, (b + 1) * cb)
            qw, kw, vw = (img2windows(t[..., sl], self.hw, win) for t in (q, k, v))
            outs.append(windows2img(mod(qw, kw, vw), self.hw, win))
        return self.proj(torch.cat(outs, dim=-1))

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One stage of the block: "attn" (x + proj(attn(LN1 x))) or "mlp" (x + MLP(LN2 x))."""
        if name == "attn":
            return x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part("mlp", self.part("attn", x))


class Merge_Block(nn.Module):  # noqa: N801 - the released module's name
    """Conv 3 x 3, stride 2, padding 1 on the grid -> tokens -> LayerNorm."""

    def __init__(self, dim: int, dim_out: int, hw: tuple[int, int], eps: float):
        super().__init__()
        k = _config.CSWIN_MERGE_KERNEL
        self.hw = hw
        self.conv = nn.Conv2d(dim, dim_out, k, stride=2, padding=k // 2)
        self.norm = nn.LayerNorm(dim_out, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        return self.norm(self.conv(x.transpose(1, 2).reshape(b, c, *self.hw)).flatten(2).transpose(1, 2))


class FlattenCSwin(nn.Module):
    """FLatten-CSwin: conv stem, four stages of CSwin blocks (focused attention where attn_types says "L"),
    conv merges, LayerNorm, mean over tokens, head."""

    def __init__(self, cfg: FlattenCSwinConfig):
        """The released attributes: the conv stem ``stage1_conv_embed`` (conv, tokens, LayerNorm), per stage the blocks
        ``stage{i+1}``, preceded from the second stage on by the conv merge ``merge{i}``, the final LayerNorm and the
        head."""
        super().__init__()
        self.cfg = cfg
        c0 = cfg.embed_dim
        self.stage1_conv_embed = nn.Sequential(
            nn.Conv2d(cfg.in_chans, c0, _config.CSWIN_STEM_KERNEL, stride=_config.CSWIN_STEM_STRIDE,
                      padding=_config.CSWIN_STEM_PADDING),
            Tokens(), nn.LayerNorm(c0, eps=cfg.layer_norm_eps))
        for i in range(cfg.n_stages):
            if i:
                setattr(self, f"merge{i}", Merge_Block(cfg.stage_dim(i - 1), cfg.stage_dim(i), cfg.stage_grids[i - 1],
                                                       cfg.layer_norm_eps))
            setattr(self, f"stage{i + 1}", nn.ModuleList(CSWinBlock(cfg, i) for _ in range(cfg.depths[i])))
        cl = cfg.stage_dim(cfg.n_stages - 1)
        self.norm = nn.LayerNorm(cl, eps=cfg.layer_norm_eps)
        self.head = nn.Linear(cl, cfg.num_classes)

    def _grid(self, x: torch.Tensor, i: int) -> torch.Tensor:
        gh, gw = self.cfg.stage_grids[i]
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], gh, gw)

    def head_unit(self, x: torch.Tensor) -> torch.Tensor:
        """The "head" unit: logits (B, num_classes) from the LayerNorm of the last stage's tokens (B, N, C), averaged
        over them."""
        return self.head(self.norm(x).mean(dim=1))

    def _block(self, name: str) -> CSWinBlock:
        stage, j = name.split(".")
        return getattr(self, stage)[int(j)]

    def run_unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Unit ``name`` ("stem", "merge{i}", "stage{i}.{j}", "head") on its input: images for the stem, else tokens
        (B, N, C)."""
        if name == "stem":
            return self.stage1_conv_embed(x)
        if name == "head":
            return self.head_unit(x)
        if name.startswith("merge"):
            return getattr(self, name)(x)
        return self._block(name)(x)

    def run_unit_part(self, name: str, part: str, x: torch.Tensor) -> torch.Tensor:
        """Part ``part`` ("attn" or "mlp") of the block unit ``name`` ("stage{i}.{j}") on ``x``."""
        return self._block(name).part(part, x)

    def _run(self, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x, feats = self.stage1_conv_embed(images), []
        for i in range(self.cfg.n_stages):
            if i:
                x = getattr(self, f"merge{i}")(x)
            for blk in getattr(self, f"stage{i + 1}"):
                x = blk(x)
            feats.append(self._grid(x, i))
        return self.head_unit(x), feats

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The reference's ``features``: each stage's output tokens as a channels-first map (B, C 2^i, H_i, W_i)."""
        return self._run(images)[1]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) of images (B, in_chans, H, W): stem, merges and stages, head."""
        return self._run(images)[0]


def build(cfg: FlattenCSwinConfig) -> nn.Module:
    """The twin of a FLatten-CSwin config."""
    if not isinstance(cfg, FlattenCSwinConfig):
        raise TypeError(f"argument 'cfg': expected FlattenCSwinConfig, got {type(cfg).__name__}")
    return FlattenCSwin(cfg)
