"""PyTorch counterparts of refimpl.attention.enhanced (L2ViT: enhanced linear attention, LCM, LGA, LWA).

Written from the L2ViT paper (Eq. 4-8, Fig. 3 and 5, Appendix 7-12) and the departures listed in refimpl's
L2ViTConfig, in the structure of the released modules: the scale multiplies (or divides) the K^T V buffer
after it is formed (the reference applies it to V first), the normaliser is torch.clamp(q . sum k, C_min), the
LCM and the blocks are nn.Modules with the released attribute names (cpe, norm1, attn, norm3, local_mp,
norm2, mlp), and LWA's window attention is refimpl.twins.modules.softmax.WindowAttention.
state_dict keys equal refimpl's parameter keys (refimpl.attention.enhanced.l2vit_param_shapes).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from refimpl.twins.modules.layers import CPE, Mlp
from refimpl.twins.modules.softmax import WindowAttention
from refimpl.attention.enhanced import L2ViTConfig


def enhanced_linear_attention(q, k, v, *, c_min: float, scale, scale_mode: str = "divide",
                              scale_target: str = "numerator", order: str = "linear") -> torch.Tensor:
    """ReLU linear attention, normaliser torch.clamp(., min=C_min), the scale applied to the K^T V buffer
    (linear order) or to (q k^T) v (quadratic) - and to the normaliser too for scale_target="similarity".
    q (B,h,N,d), k (B,h,M,d), v (B,h,M,e); scale a scalar tensor or (h, 1, 1) per head."""
    def apply(t):
        return t / scale if scale_mode == "divide" else t * scale

    q, k = F.relu(q), F.relu(k)
    if order == "linear":
        num = q @ apply(k.transpose(-2, -1) @ v)
        den = q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1)
    else:
        s = q @ k.transpose(-2, -1)
        num, den = apply(s @ v), s.sum(dim=-1, keepdim=True)
    if scale_target == "similarity":
        den = apply(den)
    return num / torch.clamp(den, min=c_min)


class EnhancedLinearAttention(nn.Module):
    """qkv -> ReLU linear attention with clamped normaliser and learnable scale -> proj; forward(x (B, N, C),
    order="linear")."""

    def __init__(self, cfg: L2ViTConfig):
        """The fused qkv Linear, proj and the learnable scale: ``scale`` (1,) initialised to sqrt(C) for scale_mode
        "scalar", else ``temperature`` (h, 1, 1) initialised to d^-1/2."""
        super().__init__()
        self.cfg = cfg
        c, h = cfg.dim, cfg.num_heads
        self.qkv = nn.Linear(c, 3 * c, bias=cfg.qkv_bias)
        self.proj = nn.Linear(c, c)
        if cfg.scale_mode == "scalar":
            self.scale = nn.Parameter(torch.full((1,), math.sqrt(c)))
        else:
            self.temperature = nn.Parameter(torch.full((h, 1, 1), cfg.head_dim ** -0.5))

    def forward(self, x: torch.Tensor, order: str = "linear") -> torch.Tensor:
        """L2ViT Eq. 4: the enhanced linear attention of x (B, N, C) (ReLU features, the normaliser clamped at C_min,
        the scale on the K^T V buffer as ``cfg`` says), projected; returns (B, N, C)."""
        cfg = self.cfg
        b, n, c = x.shape
        h = cfg.num_heads
        q, k, v = self.qkv(x).reshape(b, n, 3, h, c // h).permute(2, 0, 3, 1, 4)
        if cfg.scale_mode == "scalar":
            scale, mode = self.scale, "divide"
        else:
            scale, mode = self.temperature, "multiply"
        o = enhanced_linear_attention(q, k, v, c_min=cfg.c_min, scale=scale, scale_mode=mode,
                                      scale_target=cfg.scale_target, order=order)
        return self.proj(o.transpose(1, 2).reshape(b, n, c))


class LCM(nn.Module):
    """Local concentration module on tokens (B, N, C) of an H x W grid: conv1 -> GELU -> BN -> conv2."""

    def __init__(self, c: int, k: int = 7, bn_eps: float = 1e-5):
        """conv1 and conv2 (k x k depthwise, padding k // 2) with GELU and BatchNorm (eps ``bn_eps``) between them."""
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, k, padding=k // 2, groups=c)
        self.act = nn.GELU()
        self.bn = nn.BatchNorm2d(c, eps=bn_eps)
        self.conv2 = nn.Conv2d(c, c, k, padding=k // 2, groups=c)

    def forward(self, x: torch.Tensor, hw) -> torch.Tensor:
        """LCM (Eq. 6-7): DWConv_2(BN(GELU(DWConv_1 X))) of the tokens x (B, N, C) on the grid ``hw`` = (H, W); returns
        (B, N, C)."""
        b, n, c = x.shape
        g = x.transpose(1, 2).reshape(b, c, hw[0], hw[1])
        g = self.conv2(self.bn(self.act(self.conv1(g))))
        return g.flatten(2).transpose(1, 2)


def _cpe(m: CPE, x: torch.Tensor, hw) -> torch.Tensor:
    b, n, c = x.shape
    return m(x.transpose(1, 2).reshape(b, c, hw[0], hw[1])).flatten(2).transpose(1, 2)


def _check_part(block: nn.Module, name: str) -> None:
    if name not in block.parts:
        raise ValueError(f"argument 'name': the block has parts {block.parts}, got {name!r}")


class LGABlock(nn.Module):
    """forward(x (B, N, C), hw, order="linear"): its parts in order - "cpe" (CPE), "attn" (x + attn(LN1 x)), "lcm"
    (x + LCM(LN3 x)), "mlp" (x + MLP(LN2 x)); with lcm_placement "attention" "attn" is x + LCM(attn(LN1 x)) and
    there is no "lcm"."""

    def __init__(self, cfg: L2ViTConfig):
        """The LGA block's parts, with the released names: cpe (one CPE), norm1, attn, norm3 (lcm_placement "residual"
        only), local_mp (the LCM), norm2, mlp."""
        super().__init__()
        self.cfg = cfg
        c = cfg.dim
        self.parts = ("cpe", "attn", "lcm", "mlp") if cfg.lcm_placement == "residual" else ("cpe", "attn", "mlp")
        self.cpe = nn.ModuleList([CPE(c, cfg.cpe_kernel)])
        self.norm1 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.attn = EnhancedLinearAttention(cfg)
        if cfg.lcm_placement == "residual":
            self.norm3 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.local_mp = LCM(c, cfg.lcm_kernel, cfg.batch_norm_eps)
        self.norm2 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(c, cfg.mlp_hidden)

    def part(self, name: str, x: torch.Tensor, hw, order: str = "linear") -> torch.Tensor:
        """One residual step of the block (``self.parts``) on x (B, N, C) on the grid ``hw``: "cpe" x + DWConv(x),
        "attn" x + Attn(LN_1 x) (x + LCM(Attn(LN_1 x)) for lcm_placement "attention"), "lcm" x + LCM(LN_3 x)
        (Eq. 8), "mlp" x + MLP(LN_2 x); returns (B, N, C)."""
        _check_part(self, name)
        if name == "cpe":
            return _cpe(self.cpe[0], x, hw)
        if name == "attn":
            a = self.attn(self.norm1(x), order)
            return x + (a if self.cfg.lcm_placement == "residual" else self.local_mp(a, hw))
        if name == "lcm":
            return x + self.local_mp(self.norm3(x), hw)
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor, hw, order: str = "linear") -> torch.Tensor:
        """The LGA block on x (B, N, C) on the grid ``hw``: its parts in order; returns (B, N, C)."""
        for name in self.parts:
            x = self.part(name, x, hw, order)
        return x


class LWABlock(nn.Module):
    """forward(x (B, N, C), hw): its parts in order - "cpe" (CPE), "attn" (x + WindowAttn(LN1 x)), "cpe1" (the second
    CPE, lwa_cpe "twice" only), "mlp" (x + MLP(LN2 x))."""

    def __init__(self, cfg: L2ViTConfig):
        """The LWA block's parts: cpe (one CPE, two for lwa_cpe "twice"), norm1, attn (the window attention with the
        config's window options, -inf masking), norm2, mlp."""
        super().__init__()
        self.cfg = cfg
        c = cfg.dim
        self.parts = ("cpe", "attn", "cpe1", "mlp") if cfg.lwa_cpe == "twice" else ("cpe", "attn", "mlp")
        self.cpe = nn.ModuleList([CPE(c, cfg.cpe_kernel) for _ in range(2 if cfg.lwa_cpe == "twice" else 1)])
        self.norm1 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.attn = WindowAttention(c, cfg.num_heads, cfg.window_size, shift=cfg.window_shift, pad=True,
                                    rel_pos_bias=cfg.window_rel_pos_bias, mask_padding=cfg.window_mask_padding,
                                    mask_value=None, qkv_bias=cfg.qkv_bias)
        self.norm2 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(c, cfg.mlp_hidden)

    def part(self, name: str, x: torch.Tensor, hw) -> torch.Tensor:
        """One residual step of the block (``self.parts``) on x (B, N, C) on the grid ``hw``: "cpe" / "cpe1"
        x + DWConv(x) (cpe.0 / cpe.1), "attn" x + WindowAttn(LN_1 x), "mlp" x + MLP(LN_2 x); returns (B, N, C)."""
        _check_part(self, name)
        if name in ("cpe", "cpe1"):
            return _cpe(self.cpe[0 if name == "cpe" else 1], x, hw)
        if name == "attn":
            b, n, c = x.shape
            return x + self.attn(self.norm1(x).reshape(b, hw[0], hw[1], c)).reshape(b, n, c)
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor, hw) -> torch.Tensor:
        """The LWA block on x (B, N, C) on the grid ``hw``: its parts in order; returns (B, N, C)."""
        for name in self.parts:
            x = self.part(name, x, hw)
        return x
