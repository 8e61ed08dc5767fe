"""PyTorch twin of refimpl.attention.rala: RALA (rank-augmented linear attention) and the RAVLT block.

Reference: Fan, Huang & He, "Breaking the Low-Rank Dilemma of Linear Attention" (CVPR 2025), Eq. 2-4 and
6, §3.2; the ``official`` options follow the authors' released code (see refimpl.attention.rala).

The modules take the same frozen :class:`refimpl.attention.rala.RALAConfig` /
:class:`RAVLTBlockConfig` as the reference, and their ``state_dict`` keys and shapes are exactly
:func:`refimpl.attention.rala.rala_param_shapes` / :func:`ravlt_block_param_shapes`.  With the official
options the arithmetic follows the released code's order of operations (channels-first 1 x 1 convs, one
fused "qkvo" conv, k * softmax * N, K and V each scaled by (HW)^(-1/2), the reciprocal of the normaliser
times the numerator), so the equivalence tests check that order against the reference's exact
arithmetic.  Two deliberate differences from the released code's arithmetic (same real function, better
accuracy, documented in docs/rala.md): kappa(x) = ELU(x) + 1 is evaluated as x + 1 / exp(x) instead of
(exp(x) - 1) + 1, and the RoPE tables are computed in float64 and rounded once to the module's dtype.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from refimpl.twins.taps import Taps, capture, tap
from refimpl.attention.rala import RALAConfig, RAVLTBlockConfig

__all__ = ["kappa", "rope_2d_tables", "apply_rope_2d", "rala_core", "RALAttention", "RAVLTFFN", "RAVLTBlock"]


def kappa(x: torch.Tensor, kernel: str = "elu1") -> torch.Tensor:
    """kappa = ELU + 1 as x + 1 (x > 0) / exp(x) (x <= 0), or ReLU (RALA §3.2, Table 9)."""
    if kernel == "relu":
        return F.relu(x)
    return torch.where(x > 0, x + 1.0, torch.exp(torch.clamp(x, max=0.0)))


def rope_2d_tables(h: int, w: int, head_dim: int, base: float, dtype: torch.dtype,
                   device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (h*w, head_dim), of the released code's 2-D RoPE, computed in float64 then rounded.

    Channel c belongs to pair c // 2; the first d/4 pairs use the row index, the rest the column index,
    with frequencies base^(-q/(d/4 - 1)), q = 0 .. d/4 - 1.
    """
    n = head_dim // 4
    q = torch.arange(n, dtype=torch.float64)
    t = q / (n - 1) if n > 1 else torch.zeros(1, dtype=torch.float64)
    freq = torch.pow(torch.tensor(base, dtype=torch.float64), -t)
    freq = freq.repeat_interleave(2)                                  # (d/2,) one per channel of a half
    row = torch.arange(h, dtype=torch.float64)[:, None, None] * freq  # (h, 1, d/2)
    col = torch.arange(w, dtype=torch.float64)[None, :, None] * freq  # (1, w, d/2)
    ang = torch.cat([row.expand(h, w, -1), col.expand(h, w, -1)], dim=-1).reshape(h * w, head_dim)
    return torch.cos(ang).to(dtype=dtype, device=device), torch.sin(ang).to(dtype=dtype, device=device)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """(x_2p, x_2p+1) -> (-x_2p+1, x_2p)."""
    return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)


def apply_rope_2d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The twin of refimpl.attention.rala_core.apply_rope_2d on precomputed cos and sin tables."""
    return x * cos + _rotate_pairs(x) * sin


def rala_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: RALAConfig,
              hw: tuple[int, int] | None = None, taps: dict | None = None) -> torch.Tensor:
    """q, k, v : (B, h, N, d) -> (B, h, N, d); the twin of refimpl.attention.rala.rala_core."""
    t = taps if taps is not None else {}
    n, d = q.shape[-2], q.shape[-1]
    kq = kappa(q, cfg.kernel)
    kk = kappa(k, cfg.kernel)
    if cfg.reweight:
        q_mean = (q if cfg.global_query == "q" else kq).mean(dim=-2, keepdim=True)      # (B, h, 1, d)
        if cfg.alpha_scale == "head_dim":
            q_mean = d ** -0.5 * q_mean
        scores = tap(t, "scores", (q_mean @ kk.transpose(-1, -2))[..., 0, :])[..., None, :]   # (B, h, 1, N)
        eff = torch.softmax(scores, dim=-1).transpose(-1, -2)                           # (B, h, N, 1)
        # alpha is recorded, not consumed: the released code forms (kappa(K) softmax) N from the softmax, so a
        # forced run's weighted keys follow the forced logits (the stage's bound allows alpha's own rounding)
        t["alpha"] = (eff * n)[..., 0]
        kw = kk * eff * n
    else:
        kw = kk
    kw = tap(t, "k_weighted", kw)
    if cfg.rope:
        cos, sin = rope_2d_tables(hw[0], hw[1], d, cfg.rope_base, q.dtype, q.device)
        qn, kn = apply_rope_2d(kq, cos, sin), apply_rope_2d(kw, cos, sin)
    else:
        qn, kn = kq, kw
    if cfg.token_scaling == "mean":
        s = n ** -0.5
        kn_s, v_s = kn * s, v * s
        den = kq @ kw.mean(dim=-2, keepdim=True).transpose(-1, -2)                      # (B, h, N, 1)
    else:
        kn_s, v_s = kn, v
        den = kq @ kw.sum(dim=-2, keepdim=True).transpose(-1, -2)
    if cfg.eps:
        den = den + cfg.eps
    if cfg.order == "linear":
        num = qn @ (kn_s.transpose(-1, -2) @ v_s)
    else:
        num = (qn @ kn_s.transpose(-1, -2)) @ v_s
    num, den = tap(t, "numerator", num), tap(t, "denominator", den[..., 0])[..., None]
    if cfg.token_scaling == "mean":
        out = num * (1.0 / den)                      # the released code: q @ kv * z, z = 1 / (den + eps)
    else:
        out = num / den
    t["out"] = out
    return out


def _proj(layout: str, cin: int, cout: int, bias: bool) -> nn.Module:
    return nn.Linear(cin, cout, bias=bias) if layout == "tokens" else nn.Conv2d(cin, cout, 1, bias=bias)


class RALAttention(nn.Module):
    """The RALA layer (twin of refimpl.attention.rala.rala_attention).

    forward(x, taps=None): x (B, H, W, C) for layout "tokens", (B, C, H, W) for "channels_first"; returns
    the same shape.  taps (or, when not given, the attribute ``taps`` if set) receives "q", "k", "v" (B,h,N,d),
    "core" (B,N,C), "gate", "out".
    """

    taps: dict | None = None

    def __init__(self, cfg: RALAConfig):
        """The projections of ``cfg.layout`` (Linear for "tokens", 1 x 1 Conv2d for "channels_first"): the fused
        ``qkvo`` (4C rows, the gate last) or ``qkv`` (3C) with the gate's own ``phi`` for gate "linear"; the LePE
        depthwise conv on V when lepe_kernel > 0; the output projection ``proj`` when out_proj."""
        super().__init__()
        self.cfg = cfg
        c, lay = cfg.dim, cfg.layout
        if cfg.gate_source == "qkvo":
            self.qkvo = _proj(lay, c, 4 * c, cfg.qkv_bias)
        else:
            self.qkv = _proj(lay, c, 3 * c, cfg.qkv_bias)
            if cfg.gate == "linear":
                self.phi = _proj(lay, c, c, cfg.qkv_bias)
        if cfg.lepe_kernel:
            kl = cfg.lepe_kernel
            self.lepe = nn.Conv2d(c, c, kl, 1, kl // 2, groups=c)
        if cfg.out_proj:
            self.proj = _proj(lay, c, c, True)

    def forward(self, x: torch.Tensor, taps: dict | None = None) -> torch.Tensor:
        """RALA (Eq. 2-4, 6) of x (B, H, W, C) ("tokens") or (B, C, H, W) ("channels_first"): the projections, the
        rank-augmented core per head, + LePE(V) when configured, times the gate phi(X), then the output projection when
        configured; returns x's shape.  ``taps`` (else the attribute ``taps``) receives q, k, v, the core's "core.*"
        stages, core, gate and out."""
        t = taps if taps is not None else (self.taps if self.taps is not None else {})
        cfg, c, nh = self.cfg, self.cfg.dim, self.cfg.num_heads
        if cfg.layout == "channels_first":
            bsz, _, h, w = x.shape
            p = self.qkvo(x) if cfg.gate_source == "qkvo" else self.qkv(x)            # (B, mC, H, W)
            # 'b (m n d) h w -> m b n (h w) d'
            heads = p[:, :3 * c].reshape(bsz, 3, nh, c // nh, h * w).permute(1, 0, 2, 4, 3)
            q, k, v = heads[0], heads[1], heads[2]
            v_grid = p[:, 2 * c:3 * c]
            if cfg.gate_source == "qkvo":
                gate = p[:, 3 * c:]
            elif cfg.gate == "linear":
                gate = self.phi(x)
            elif cfg.gate == "identity":
                gate = x
            elif cfg.gate == "tanh":
                gate = torch.tanh(x)
            else:
                gate = None
        else:
            bsz, h, w, _ = x.shape
            tok = x.reshape(bsz, h * w, c)
            p = self.qkvo(tok) if cfg.gate_source == "qkvo" else self.qkv(tok)      # (B, N, mC)
            heads = p[..., :3 * c].reshape(bsz, h * w, 3, nh, c // nh).permute(2, 0, 3, 1, 4)
            q, k, v = heads[0], heads[1], heads[2]
            v_grid = p[..., 2 * c:3 * c].transpose(1, 2).reshape(bsz, c, h, w)
            if cfg.gate_source == "qkvo":
                gate = p[..., 3 * c:]
            else:
                gate = {"linear": lambda: self.phi(tok), "identity": lambda: tok, "tanh": lambda: torch.tanh(tok),
                        "none": lambda: None}[cfg.gate]()
        t["q"], t["k"], t["v"] = q, k, v
        core_taps = Taps({name[5:]: val for name, val in getattr(t, "forced", {}).items()
                          if name.startswith("core.")})
        y = rala_core(q, k, v, cfg, (h, w), taps=core_taps)                             # (B, h, N, d)
        t.update({"core." + name: val for name, val in core_taps.items()})
        if cfg.layout == "channels_first":
            y = y.permute(0, 1, 3, 2).reshape(bsz, c, h, w)       # 'b n (h w) d -> b (n d) h w'
        else:
            y = y.permute(0, 2, 1, 3).reshape(bsz, h * w, c)
        y = tap(t, "core", y)
        if cfg.lepe_kernel:
            lepe = self.lepe(v_grid)
            y = y + (lepe if cfg.layout == "channels_first" else lepe.reshape(bsz, c, h * w).transpose(1, 2))
        if gate is not None:
            y = y * gate
        t["gate"] = gate
        if cfg.out_proj:
            y = self.proj(y)
        out = y if cfg.layout == "channels_first" else y.reshape(bsz, h, w, c)
        t["out"] = out
        return out


class RAVLTFFN(nn.Module):
    """fc1 -> GELU -> (h + DWConv3x3(h)) -> fc2 (twin of refimpl.attention.rala.ravlt_ffn)."""

    def __init__(self, cfg: RAVLTBlockConfig):
        """fc1 (C -> hidden) and fc2 (hidden -> C), Linear or 1 x 1 conv by the layout, and with ffn_dwconv the 3 x 3
        depthwise ``dwconv`` on the hidden channels."""
        super().__init__()
        self.cfg = cfg
        c, hd, lay = cfg.attn.dim, cfg.hidden, cfg.attn.layout
        self.fc1 = _proj(lay, c, hd, True)
        if cfg.ffn_dwconv:
            self.dwconv = nn.Conv2d(hd, hd, 3, 1, 1, groups=hd)
        self.fc2 = _proj(lay, hd, c, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """fc2(g) with g = GELU(fc1 x), plus DWConv3x3(g) as a residual when ffn_dwconv, on x in the block's layout;
        returns x's shape."""
        cf = self.cfg.attn.layout == "channels_first"
        hid = F.gelu(self.fc1(x))
        if self.cfg.ffn_dwconv:
            if cf:
                hid = hid + self.dwconv(hid)
            else:
                g = hid.permute(0, 3, 1, 2)
                hid = hid + self.dwconv(g).permute(0, 2, 3, 1)
        return self.fc2(hid)


class _ChannelNorm(nn.LayerNorm):
    """LayerNorm over C of a (B, C, H, W) tensor (the released code's LayerNorm2d; state_dict keys
    "weight", "bias" as nn.LayerNorm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RAVLTBlock(nn.Module):
    """CPE, pre-norm RALA, pre-norm FFN (twin of refimpl.attention.rala.ravlt_block).

    forward(x, taps=None): taps receives "cpe", "norm1", "attn", "res1", "norm2", "ffn", "out".
    """

    def __init__(self, cfg: RAVLTBlockConfig):
        """The CPE depthwise conv ``pos`` (when cpe_kernel > 0), norm1 and norm2 (LayerNorm over C in either layout),
        the RALA layer ``attn``, the FFN and, with layerscale, gamma_1 and gamma_2 (ones)."""
        super().__init__()
        self.cfg = cfg
        c = cfg.attn.dim
        if cfg.cpe_kernel:
            self.pos = nn.Conv2d(c, c, cfg.cpe_kernel, 1, cfg.cpe_kernel // 2, groups=c)
        norm = _ChannelNorm if cfg.attn.layout == "channels_first" else nn.LayerNorm
        self.norm1 = norm(c, eps=cfg.norm_eps)
        self.attn = RALAttention(cfg.attn)
        self.norm2 = norm(c, eps=cfg.norm_eps)
        self.ffn = RAVLTFFN(cfg)
        if cfg.layerscale:
            shape = (1, c, 1, 1) if cfg.attn.layout == "channels_first" else (c,)
            self.gamma_1 = nn.Parameter(torch.ones(shape))
            self.gamma_2 = nn.Parameter(torch.ones(shape))

    def forward(self, x: torch.Tensor, taps: dict | None = None) -> torch.Tensor:
        """The RAVLT block (§3.2, Fig. 6) on x in the layout's shape: x + CPE(x), then x + gamma_1 RALA(LN_1 x) and
        x + gamma_2 FFN(LN_2 x) (the gammas with layerscale only); returns x's shape, ``taps`` receiving the tensors
        between the steps."""
        t = taps if taps is not None else {}
        cf = self.cfg.attn.layout == "channels_first"
        if self.cfg.cpe_kernel:
            x = x + (self.pos(x) if cf else self.pos(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))
        t["cpe"] = x
        n1 = self.norm1(x)
        t["norm1"] = n1
        a = self.attn(n1)
        t["attn"] = a
        x = x + (self.gamma_1 * a if self.cfg.layerscale else a)
        t["res1"] = x
        n2 = self.norm2(x)
        t["norm2"] = n2
        f = self.ffn(n2)
        t["ffn"] = f
        out = x + (self.gamma_2 * f if self.cfg.layerscale else f)
        t["out"] = out
        return out


def stage_tensors(module: RALAttention, run, hw, force=None) -> dict[str, torch.Tensor]:
    """Run ``run()`` (a forward of ``module``, no arguments) once and return the tensors of
    refimpl.attention.rala.rala_attention_stages (either cut), in the layout of x: submodule inputs and outputs
    through forward hooks (the fused projection, phi, LePE, the output projection), the core and its parts
    ("alpha", "k_weighted", "numerator", "denominator", in the heads layout) from ``taps``.  In the
    tokens layout the (B, N, X) tensors of the Linear projections are viewed as (B, H, W, X) and LePE's
    channels-first output is moved to channels-last.  ``force``: these tensors (an earlier call's, in the same
    layout) replace the twin's own (capture's teacher forcing)."""
    cfg = module.cfg
    key = "qkvo" if cfg.gate_source == "qkvo" else "qkv"
    points = {"x": (key, "input"), "proj_in": (key, "output")}
    if key == "qkv" and cfg.gate == "linear":
        points["phi"] = ("phi", "output")
    if cfg.lepe_kernel:
        points["lepe"] = ("lepe", "output")
    if cfg.out_proj:
        points["gated"], points["out"] = ("proj", "input"), ("proj", "output")
    parts = ("scores", "alpha", "k_weighted", "numerator", "denominator")
    tokens = cfg.layout == "tokens"
    raw = {}
    for name, t in (force or {}).items():     # back to the twin's own layout and names
        if name in parts:
            raw["core." + name] = t
        elif name == "gated" and not cfg.out_proj:
            continue                              # the module's output: nothing runs after it
        elif tokens and name == "lepe":
            raw[name] = t.permute(0, 3, 1, 2)
        elif tokens and name in set(points) - {"out"} | {"core"}:
            raw[name] = t.reshape(t.shape[0], -1, t.shape[-1])
        else:
            raw[name] = t
    got = capture(module, run, points, taps=True, force=raw)
    for name in parts:
        if "core." + name in got:
            got[name] = got["core." + name]
    if not cfg.out_proj:
        got["gated"] = got["out"]
    if tokens:
        h, w = hw
        for name in set(points) | {"core", "gated"}:      # the tensors in the layout of x
            t = got[name]
            if name == "lepe":
                got[name] = t.permute(0, 2, 3, 1)
            elif t.dim() == 3:
                got[name] = t.reshape(t.shape[0], h, w, t.shape[-1])
    return got
