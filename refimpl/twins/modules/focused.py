"""PyTorch counterparts of refimpl.attention.focused (FLatten's focused linear attention).

Written from the FLatten paper (Eq. 4-6, 10-12) and the departures listed in refimpl's FocusedConfig, in the
structure of the released modules (token-major projections, norms taken before the power and re-applied
after it, a reciprocal normaliser z, nn.Conv2d depthwise DWC, F.interpolate for sr > 1), so that the
equivalence suite checks a second, independent route against the NumPy reference:

- f_p is the reference's max-scaled form (r = x / max x, ||x|| = max x ||r||, r^p / ||r^p||) with torch's
  norm (torch.linalg.vector_norm) and the other product order (r^p / ||r^p|| * ||x||);
- the shifted-window mask is applied by zeroing masked scores in the quadratic order (the reference groups
  queries by mask row in both orders), and Swin's mask comes from refimpl.twins.modules.layers (derived from
  the roll, the reference's from Swin's region slices);
- resampling uses F.interpolate(align_corners=False).

state_dict keys equal refimpl's parameter keys (refimpl.attention.focused.focused_param_shapes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from refimpl.twins.taps import capture, tap
from refimpl.twins.modules.layers import pair, shifted_window_mask, window_partition, window_reverse
from refimpl.attention.focused import FocusedConfig


def focused_function(x: torch.Tensor, p: float, dim: int = -1, power_scaling: str = "max") -> torch.Tensor:
    """f_p(x) = ||x|| / ||x**p|| x**p (FLatten Eq. 6) for x >= 0.  "max": the power is taken of x / max(x)
    (homogeneity), so it neither overflows nor vanishes; a zero vector maps to 0.  "none": as written."""
    if power_scaling == "none":
        t = x ** p
        return t / torch.linalg.vector_norm(t, dim=dim, keepdim=True) * torch.linalg.vector_norm(x, dim=dim,
                                                                                                 keepdim=True)
    m = torch.amax(x, dim=dim, keepdim=True)
    r = x / torch.where(m > 0, m, torch.ones_like(m))
    # ||x|| as m ||x / m||: a plain norm squares tiny vectors to 0 (e.g. a float64-subnormal or a float16
    # vector below ~2^-12.5), and t / ||t|| * 0 then loses the whole token.
    x_norm = m * torch.linalg.vector_norm(r, dim=dim, keepdim=True)
    t = r ** p
    f = t / torch.linalg.vector_norm(t, dim=dim, keepdim=True) * x_norm
    return torch.where(m == 0, x * 0, f)


def _attend(q, k, v, normaliser: str, eps: float, order: str, mask=None):
    """Normalised q k^T v per head; q (B,h,N,d), k (B,h,n,d), v (B,h,n,e); mask (B,1,N,n) bool or None
    (quadratic order only - the linear order groups queries, see attend)."""
    n = k.shape[-2]
    if normaliser == "sum":
        if order == "linear":
            num = q @ (k.transpose(-2, -1) @ v)
            den = q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1)
        else:
            s = q @ k.transpose(-2, -1)
            if mask is not None:
                s = s.masked_fill(~mask, 0.0)
            num, den = s @ v, s.sum(dim=-1, keepdim=True)
        return num / (den + eps) if eps else num / den
    # the released normaliser: z = 1 / (q . mean(k) + eps), K and V each scaled by n^-1/2
    if order == "linear":
        z = 1.0 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + eps)
        return q @ ((k.transpose(-2, -1) * n ** -0.5) @ (v * n ** -0.5)) * z
    s = q @ k.transpose(-2, -1)
    if mask is None:
        z = 1.0 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + eps)
        return (q @ (k * n ** -0.5).transpose(-2, -1)) @ (v * n ** -0.5) * z
    s = s.masked_fill(~mask, 0.0)
    cnt = mask.sum(dim=-1, keepdim=True).to(q.dtype)
    z = 1.0 / (s.sum(dim=-1, keepdim=True) / cnt + eps)
    return (s @ v) / cnt * z


def attend(q, k, v, normaliser: str, eps: float, order: str, mask=None):
    """As _attend; mask (nW, N, n) bool with windows interleaved in the batch as b * nW + w."""
    if mask is None:
        return _attend(q, k, v, normaliser, eps, order)
    nw = mask.shape[0]
    if order == "quadratic":
        full = mask.repeat(q.shape[0] // nw, 1, 1)[:, None]
        return _attend(q, k, v, normaliser, eps, order, full)
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    for w in range(nw):
        rows, inv = torch.unique(mask[w], dim=0, return_inverse=True)
        for g in range(rows.shape[0]):
            qi = torch.nonzero(inv == g).flatten()
            kj = torch.nonzero(rows[g]).flatten()
            out[w::nw, :, qi] = _attend(q[w::nw][:, :, qi], k[w::nw][:, :, kj], v[w::nw][:, :, kj], normaliser, eps,
                                        order)
    return out


class _FocusedBase(nn.Module):
    """Shared pieces: features, DWC, projection.  ``taps``: None, or a dict that each forward fills with the
    tensors a stage-wise comparison needs besides submodule inputs and outputs ("phi_q", "phi_k",
    "attention"; refimpl.attention.focused.focused_linear_attention_stages with ``fine=True``)."""

    taps: dict | None = None

    def _common(self, cfg: FocusedConfig, n_kv: int):
        c, d, kk = cfg.dim, cfg.head_dim, cfg.kernel_size
        nb = d if cfg.dwc_shared else c
        self.dwc = nn.Conv2d(nb, nb, kk, padding=kk // 2, groups=nb)
        self.proj = nn.Linear(c, c)
        if cfg.learnable_scale:
            self.scale = nn.Parameter(torch.zeros(1, 1, c))
        if cfg.positional_encoding:
            self.positional_encoding = nn.Parameter(torch.zeros(1, n_kv, c))

    def _features(self, t: torch.Tensor) -> torch.Tensor:
        cfg, h = self.cfg, self.cfg.num_heads
        a = F.relu(t)
        if cfg.relu_eps:
            a = a + cfg.relu_eps
        if cfg.learnable_scale:
            a = a / F.softplus(self.scale)
        b, n, c = a.shape
        if cfg.norm_scope == "token":
            return focused_function(a, cfg.p, -1, cfg.power_scaling).reshape(b, n, h, c // h).transpose(1, 2)
        return focused_function(a.reshape(b, n, h, c // h).transpose(1, 2), cfg.p, -1, cfg.power_scaling)

    def _tail(self, q, k, v, hw_kv, hw_q, mask, order):
        cfg, h = self.cfg, self.cfg.num_heads
        if cfg.positional_encoding:
            k = k + self.positional_encoding
        b, n, c = v.shape
        d = c // h
        qf, kf = tap(self.taps, "phi_q", self._features(q)), tap(self.taps, "phi_k", self._features(k))
        vh = v.reshape(b, n, h, d).transpose(1, 2)                         # (B, h, n, d)
        att = tap(self.taps, "attention", attend(qf, kf, vh, cfg.normaliser, cfg.eps, order, mask))
        big_h, big_w = hw_q
        if tuple(hw_kv) != tuple(hw_q):
            if cfg.dwc_resample == "linear_flat":
                vr = F.interpolate(vh.transpose(-2, -1).reshape(b * h, d, n), size=big_h * big_w, mode="linear",
                                   align_corners=False)                       # (B h, d, N)
                grid = vr.reshape(b * h, d, big_h, big_w)
            else:
                g = vh.transpose(-2, -1).reshape(b * h, d, hw_kv[0], hw_kv[1])
                grid = F.interpolate(g, size=(big_h, big_w), mode="bilinear", align_corners=False)
        else:
            grid = vh.transpose(-2, -1).reshape(b * h, d, big_h, big_w)
        if cfg.dwc_shared:
            dw = self.dwc(grid)                                              # (B h, d, H, W)
        else:
            dw = self.dwc(grid.reshape(b, h * d, big_h, big_w))
        dw = dw.reshape(b, h, d, big_h * big_w).transpose(-2, -1)             # (B, h, N, d)
        y = (att + dw).transpose(1, 2).reshape(b, big_h * big_w, c)
        return self.proj(y)


class FocusedLinearAttention(_FocusedBase):
    """DeiT / PVT layout: forward(x (B, N, C), hw, order="linear") -> (B, N, C)."""

    def __init__(self, cfg: FocusedConfig, n_kv: int):
        """The q and kv Linears, for sr_ratio > 1 the reduction conv ``sr`` (kernel and stride sr) and its LayerNorm,
        then the DWC, proj and the optional learnable scale and positional encoding (``n_kv`` key tokens)."""
        super().__init__()
        self.cfg = cfg
        c = cfg.dim
        self.q = nn.Linear(c, c, bias=cfg.qkv_bias)
        self.kv = nn.Linear(c, 2 * c, bias=cfg.qkv_bias)
        if cfg.sr_ratio > 1:
            self.sr = nn.Conv2d(c, c, cfg.sr_ratio, stride=cfg.sr_ratio)
            self.norm = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self._common(cfg, n_kv)

    def forward(self, x: torch.Tensor, hw, order: str = "linear") -> torch.Tensor:
        """FLatten Eq. 4-6, 10-12 in the DeiT / PVT layout: the focused linear attention of x (B, N, C) on the grid
        ``hw`` = (H, W), K and V from the sr-reduced grid when sr_ratio > 1, plus the DWC of V (resampled to the query
        grid), projected; returns (B, N, C).  ``order``: "linear" or "quadratic" association."""
        b, n, c = x.shape
        big_h, big_w = hw
        q = self.q(x)
        if self.cfg.sr_ratio > 1:
            red = self.sr(x.transpose(1, 2).reshape(b, c, big_h, big_w))
            hw_kv = (red.shape[2], red.shape[3])
            src = self.norm(red.flatten(2).transpose(1, 2))
        else:
            hw_kv, src = (big_h, big_w), x
        k, v = self.kv(src).chunk(2, dim=-1)
        return self._tail(q, k, v, hw_kv, (big_h, big_w), None, order)


class FocusedWindowAttention(_FocusedBase):
    """Swin layout: forward(x (B, N, C), hw, shift=0, order="linear") -> (B, N, C).  window_size : an int ws or a
    pair (wh, ww); shift : an int or a pair (sh, sw), 0 <= shift < window on each axis (each axis rolled by its
    own shift; the DWC runs on the wh x ww window grid; the positional encoding covers wh ww tokens)."""

    def __init__(self, cfg: FocusedConfig, window_size):
        """The fused qkv Linear, the DWC on the wh x ww window grid, proj and the optional learnable scale and
        positional encoding (wh ww tokens); TypeError / ValueError for a window that is not an int >= 1 or a pair of
        them."""
        super().__init__()
        self.cfg, self.ws = cfg, window_size
        self.wpair = pair(window_size, "window_size")
        if min(self.wpair) < 1:
            raise ValueError(f"argument 'window_size': expected an int >= 1 or a pair of them, got {window_size!r}")
        c = cfg.dim
        self.qkv = nn.Linear(c, 3 * c, bias=cfg.qkv_bias)
        self._common(cfg, self.wpair[0] * self.wpair[1])

    def forward(self, x: torch.Tensor, hw, shift=0, order: str = "linear") -> torch.Tensor:
        """FLatten's focused linear attention in the Swin layout: x (B, N, C) on the grid ``hw`` rolled by -shift, cut
        into windows, the focused attention plus DWC of each window (the shift mask applied unless shift_mask is
        "ignore"), projected, merged and rolled back; returns (B, N, C).  No padding: ValueError for an ``hw`` that is
        not a multiple of the window or does not hold N tokens, and for a shift outside [0, window) on an axis."""
        b, n, c = x.shape
        big_h, big_w = hw
        ws = self.wpair
        if big_h % ws[0] or big_w % ws[1] or big_h * big_w != n:
            # window_partition would drop the remainder and window_reverse leave it uninitialised
            raise ValueError(f"argument 'hw': expected a grid of N = {n} tokens that is a multiple of the window "
                             f"{ws} (the Swin layout does not pad), got {tuple(hw)}")
        sh, sw = pair(shift, "shift")
        if not (0 <= sh < ws[0] and 0 <= sw < ws[1]):
            raise ValueError(f"argument 'shift': expected 0 <= shift < window {ws} on each axis, got {shift!r}")
        g = x.reshape(b, big_h, big_w, c)
        if sh or sw:
            g = torch.roll(g, shifts=(-sh, -sw), dims=(1, 2))
        win = window_partition(g, ws)
        q, k, v = self.qkv(win).chunk(3, dim=-1)
        mask = None
        if (sh or sw) and self.cfg.shift_mask == "apply":
            mask = shifted_window_mask(big_h, big_w, ws, (sh, sw)).to(x.device)
        y = self._tail(q, k, v, ws, ws, mask, order)
        g = window_reverse(y, ws, big_h, big_w)
        if sh or sw:
            g = torch.roll(g, shifts=(sh, sw), dims=(1, 2))
        return g.reshape(b, n, c)


#: Where the stage tensors of refimpl.attention.focused's stage lists are in these modules: tensor name ->
#: (submodule, "input" | "output"); "phi_q", "phi_k" and "attention" come from ``taps``.
STAGE_POINTS = {
    "global": {"x": ("q", "input"), "q": ("q", "output"), "sr": ("sr", "output"), "norm": ("norm", "output"),
               "kv": ("kv", "output"), "dwc_in": ("dwc", "input"), "dwc": ("dwc", "output"),
               "core": ("proj", "input"), "proj": ("proj", "output")},
    "window": {"x": ("qkv", "input"), "qkv": ("qkv", "output"), "dwc_in": ("dwc", "input"),
               "dwc": ("dwc", "output"), "core": ("proj", "input"), "proj": ("proj", "output")},
}


def stage_tensors(module: _FocusedBase, run, force=None) -> dict[str, torch.Tensor]:
    """Run ``run()`` (a forward of ``module``) once and return the tensors of the fine stage list
    (refimpl.attention.focused.focused_linear_attention_stages / focused_window_attention_stages with
    ``fine=True``): submodule inputs and outputs through forward hooks, the features and the attention through
    ``module.taps``.  ``force``: these tensors (an earlier call's) replace the twin's own (capture's teacher
    forcing)."""
    points = dict(STAGE_POINTS["window" if isinstance(module, FocusedWindowAttention) else "global"])
    if not hasattr(module, "sr"):
        points.pop("sr", None)
        points.pop("norm", None)
    return capture(module, run, points, taps=True, force=force)
