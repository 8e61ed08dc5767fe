"""PyTorch twin of refimpl.attention.angular (Castling-ViT linear-angular attention).

Everything here mirrors a NumPy function of :mod:`refimpl.attention.angular` with the same name (suffix
``_t`` for functions) and argument order; :class:`CastlingAttention` is the nn.Module whose state_dict keys
are exactly :meth:`refimpl.attention.angular.CastlingConfig.param_shapes`.  The ``official`` preset computes
what the authors' released ``LinAngularAttention`` computes (see the reference module's docstring); this
file is written from the paper's equations and the issue's description, not copied.

Shapes: B batch, h heads, N tokens, d head dim, C = h d.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from refimpl.attention.angular import CastlingConfig, arcsin_coefficients_exact

__all__ = ["unit_rows_t", "spectral_angle_t", "angular_similarity_t", "angular_similarity_series_t",
           "angular_attention_t", "masked_softmax_branch_t", "castling_core_t", "CastlingAttention"]


def unit_rows_t(x: torch.Tensor, eps: float, policy: str) -> torch.Tensor:
    """q / max(||q||, eps) ("clamp", paper) or q / ||q|| ("none", official; a zero row gives NaN)."""
    n = x.norm(dim=-1, keepdim=True)
    return x / (n.clamp_min(eps) if policy == "clamp" else n)


def _row_is_unit(x: torch.Tensor, eps: float, policy: str) -> torch.Tensor:
    if policy == "none":
        return torch.ones(x.shape[:-1], dtype=torch.bool, device=x.device)
    return x.norm(dim=-1) >= eps


def spectral_angle_t(q, k, *, method="atan2", eps=1e-12, policy="clamp"):
    """theta = arccos(q^.k^) (Eq. 4); "atan2" uses 2 atan2(||q^-k^||, ||q^+k^||) on unit rows."""
    qh, kh = unit_rows_t(q, eps, policy), unit_rows_t(k, eps, policy)
    c = qh @ kh.transpose(-1, -2)
    cc = c.clamp(-1.0, 1.0)
    if method == "arccos":
        return torch.arccos(cc)
    if method == "arcsin":
        return math.pi / 2 - torch.arcsin(cc)
    diff = qh.unsqueeze(-2) - kh.unsqueeze(-3)
    summ = qh.unsqueeze(-2) + kh.unsqueeze(-3)
    theta = 2.0 * torch.atan2(diff.norm(dim=-1), summ.norm(dim=-1))
    unit = _row_is_unit(q, eps, policy).unsqueeze(-1) & _row_is_unit(k, eps, policy).unsqueeze(-2)
    return torch.where(unit, theta, torch.arccos(cc))


def angular_similarity_t(q, k, *, method="atan2", eps=1e-12, policy="clamp"):
    """Sim = 1 - theta/pi (Eq. 5)."""
    return 1.0 - spectral_angle_t(q, k, method=method, eps=eps, policy=policy) / math.pi


def _arcsin_series_t(x: torch.Tensor, order: int) -> torch.Tensor:
    c = [float(f) for f in arcsin_coefficients_exact(order)]
    t = x * x
    acc = torch.full_like(x, c[-1])
    for ck in c[-2::-1]:
        acc = acc * t + ck
    return x * acc


def angular_similarity_series_t(q, k, order, *, eps=1e-12, policy="clamp"):
    """Sim_K = 1/2 + T_K(q^.k^)/pi (Eq. 8 truncated at order K)."""
    c = unit_rows_t(q, eps, policy) @ unit_rows_t(k, eps, policy).transpose(-1, -2)
    return 0.5 + _arcsin_series_t(c, order) / math.pi


def angular_attention_t(q, k, v, *, order=None, normalize=False, method="atan2", eps=1e-12, policy="clamp"):
    """Quadratic angular attention A V [/ A 1] with the exact (order None) or truncated kernel."""
    if order is None:
        a = angular_similarity_t(q, k, method=method, eps=eps, policy=policy)
    else:
        a = angular_similarity_series_t(q, k, order, eps=eps, policy=policy)
    out = a @ v
    if normalize:
        out = out / a.sum(dim=-1, keepdim=True)
    return out


def masked_softmax_branch_t(q, k, v, *, threshold=0.02, scale=1.0):
    """Mask_eps(Softmax((s q) k^T)) V (Eq. 10): keep P > eps, no renormalisation; NaN propagates."""
    p = ((q * scale) @ k.transpose(-1, -2)).softmax(dim=-1)
    return (p * (p > threshold)) @ v


def _features_t(xh: torch.Tensor, order: int) -> torch.Tensor:
    c = [float(f) for f in arcsin_coefficients_exact(order)]
    parts, power = [], xh
    for kk in range(order + 1):
        if kk:
            power = (power[..., :, None, None] * xh[..., None, :, None] * xh[..., None, None, :]).flatten(-3)
        parts.append(math.sqrt(c[kk] / math.pi) * power)
    return torch.cat(parts, dim=-1)


def castling_core_t(q, k, v, cfg: CastlingConfig, *, conv_weight=None, conv_bias=None, training=False,
                    hw=None):
    """The twin of refimpl castling_core: Eq. 9-10 on per-head q, k, v (B, h, N, d)."""
    n = q.shape[-2]
    qh = unit_rows_t(q, cfg.qk_norm_eps, cfg.qk_norm)
    kh = unit_rows_t(k, cfg.qk_norm_eps, cfg.qk_norm)
    if cfg.order == 0:
        series = (1.0 / math.pi) * (qh @ (kh.transpose(-1, -2) @ v))
        fq, fk = qh, kh
    else:
        fq, fk = _features_t(qh, cfg.order), _features_t(kh, cfg.order)
        series = fq @ (fk.transpose(-1, -2) @ v)
    const = 0.5 * v if cfg.constant == "own" else (0.5 * v.sum(dim=-2, keepdim=True)).expand_as(v)
    sparse = None
    if cfg.sparse_active(training):
        if cfg.sparse_logits == "unit":
            sparse = masked_softmax_branch_t(qh, kh, v, threshold=cfg.sparse_eps, scale=1.0)
        else:
            sparse = masked_softmax_branch_t(q, k, v, threshold=cfg.sparse_eps, scale=cfg.head_dim ** -0.5)
    if cfg.normaliser == "output_l2":
        ang = const + series if sparse is None else (sparse + const) + series
        out = ang / ang.norm(dim=-1, keepdim=True)
    else:
        out = const + series
        if cfg.normaliser == "similarity_sum":
            dot = (fq * fk.sum(dim=-2, keepdim=True)).sum(dim=-1, keepdim=True)
            if cfg.order == 0:
                dot = (1.0 / math.pi) * dot
            out = out / (n / 2.0 + dot)
    if cfg.conv == "tokens1d":
        kk = conv_weight.shape[2]
        out = out + F.conv2d(v, conv_weight, conv_bias, padding=(kk // 2, 0), groups=v.shape[1])
    elif cfg.conv == "grid2d":
        b, h, _, d = v.shape
        img = v.transpose(-1, -2).reshape(b, h * d, hw[0], hw[1])
        kk = conv_weight.shape[2]
        dwc = F.conv2d(img, conv_weight, conv_bias, padding=kk // 2, groups=h * d)
        out = out + dwc.reshape(b, h, d, n).transpose(-1, -2)
    if sparse is not None and cfg.normaliser != "output_l2":
        out = out + sparse
    return out


class CastlingAttention(nn.Module):
    """Castling-ViT attention layer (qkv, castling core, proj) configured by a :class:`CastlingConfig`.

    The auxiliary branch follows ``cfg.sparse``: "train_only" uses it in ``train()`` mode and drops it in
    ``eval()`` (the castling switch of Sec. 3.2.2); "always"/"off" ignore the mode (the released code).
    """

    def __init__(self, cfg: CastlingConfig):
        """The fused qkv Linear, proj and the conv branch's depthwise ``dconv``: (k, 1) over the tokens with the h heads
        as channels ("tokens1d"), k x k over the H x W grid on C channels ("grid2d"), or None ("none"); its bias per
        conv_bias."""
        super().__init__()
        self.cfg = cfg
        c, h, k = cfg.dim, cfg.num_heads, cfg.conv_kernel
        self.qkv = nn.Linear(c, 3 * c, bias=cfg.qkv_bias)
        self.proj = nn.Linear(c, c)
        if cfg.conv == "tokens1d":
            self.dconv = nn.Conv2d(h, h, (k, 1), padding=(k // 2, 0), groups=h, bias=cfg.conv_bias)
        elif cfg.conv == "grid2d":
            self.dconv = nn.Conv2d(c, c, k, padding=k // 2, groups=c, bias=cfg.conv_bias)
        else:
            self.dconv = None

    def forward(self, x: torch.Tensor, hw=None) -> torch.Tensor:
        """Castling-ViT Eq. 9-10: the castling core of x (B, N, C) (the sparse branch per ``cfg.sparse`` and the
        train / eval mode), projected; returns (B, N, C).  ``hw`` = (H, W) is needed by the "grid2d" conv only."""
        b, n, c = x.shape
        h = self.cfg.num_heads
        q, k, v = self.qkv(x).reshape(b, n, 3, h, c // h).permute(2, 0, 3, 1, 4).unbind(0)
        heads = castling_core_t(q, k, v, self.cfg,
                                conv_weight=None if self.dconv is None else self.dconv.weight,
                                conv_bias=None if self.dconv is None else self.dconv.bias,
                                training=self.training, hw=hw)
        return self.proj(heads.transpose(1, 2).reshape(b, n, c))
