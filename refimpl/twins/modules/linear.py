"""PyTorch counterpart of refimpl.attention.linear: kernelized linear attention over per-head tensors.

Written with torch's own primitives (F.relu, F.elu, F.leaky_relu, torch.softmax, F.normalize) and einsum,
independently of the NumPy reference.  The module has no parameters (state_dict is empty); its options
mirror :func:`refimpl.attention.linear.linear_attention`'s names.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

FEATURE_MAPS = ("identity", "relu", "elu1", "softmax", "l1", "leaky_relu")


def feature_map(x: torch.Tensor, name: str, options: Mapping[str, Any] | None = None,
                elu1_form: str = "exp") -> torch.Tensor:
    """phi(x) with torch primitives.  l1 is ``F.normalize(base(x), p=1, dim=axis)`` (clamp at eps 1e-12 by
    default).  elu1: ``elu1_form="exp"`` evaluates where(x > 0, x + 1, exp(x)); ``"elu_plus_one"`` is the
    idiomatic ``F.elu(x) + 1`` (Katharopoulos et al.'s code), which returns exactly 0 once exp(x) < u/2
    (x < about -17 in float32, -37 in float64) and then gives 0/0 normalisers that the definition does not
    have (see equivalence/test_linear.py::test_elu_plus_one_underflow_finding)."""
    o = dict(options or {})
    if name == "identity":
        return x
    if name == "relu":
        return F.relu(x)
    if name == "leaky_relu":
        return F.leaky_relu(x, o.get("negative_slope", 0.01))
    if name == "elu1":
        if elu1_form == "elu_plus_one":
            return F.elu(x) + 1
        return torch.where(x > 0, x + 1, torch.exp(torch.clamp(x, max=0)))
    if name == "softmax":
        return torch.softmax(x, dim=o.get("axis", -1))
    if name == "l1":
        base = o.get("base", "relu")
        b = feature_map(x, base, {"negative_slope": o["negative_slope"]} if "negative_slope" in o else None)
        return F.normalize(b, p=1, dim=o.get("axis", -1), eps=o.get("eps", 1e-12))
    raise ValueError(f"argument 'name': expected a feature map of {sorted(FEATURE_MAPS)}, got {name!r}")


class LinearAttention(nn.Module):
    """O = phi(Q) (phi(K)^T V) / (phi(Q) . sum_j phi(K_j))  (order="linear")
    or ((phi(Q) phi(K)^T) V) / rowsum(phi(Q) phi(K)^T)  (order="quadratic"),
    with den -> max(den, clamp_min) then den + eps ("add") or max(den, eps) ("clamp").

    forward(q (B,h,N,d), k (B,h,M,d), v (B,h,M,e)) -> (B,h,N,e).
    """

    def __init__(self, feature_map: str = "relu", order: str = "linear", normalize: bool = True,
                 eps: float = 0.0, eps_policy: str = "add", clamp_min: float | None = None,
                 feature_map_options: Mapping[str, Any] | None = None, elu1_form: str = "exp"):
        """Stores the options (no parameters); raises ValueError for a feature map not in FEATURE_MAPS, an order other
        than "linear" / "quadratic" or an eps_policy other than "add" / "clamp"."""
        super().__init__()
        for arg, value, allowed in (("feature_map", feature_map, tuple(FEATURE_MAPS)),
                                    ("order", order, ("linear", "quadratic")), ("eps_policy", eps_policy, ("add", "clamp"))):
            if value not in allowed:
                raise ValueError(f"argument '{arg}': expected one of {allowed}, got {value!r}")
        self.feature_map, self.order, self.normalize = feature_map, order, normalize
        self.eps, self.eps_policy, self.clamp_min = eps, eps_policy, clamp_min
        self.feature_map_options = dict(feature_map_options or {})
        self.elu1_form = elu1_form

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """O for q (B, h, N, d), k (B, h, M, d), v (B, h, M, e): phi(Q) (phi(K)^T V) ("linear") or (phi(Q) phi(K)^T) V
        ("quadratic"), divided by its normaliser (clamped at clamp_min, then eps added or clamped at eps) unless
        ``normalize`` is False; returns (B, h, N, e)."""
        fq = feature_map(q, self.feature_map, self.feature_map_options, self.elu1_form)
        fk = feature_map(k, self.feature_map, self.feature_map_options, self.elu1_form)
        if self.order == "linear":
            kv = torch.einsum("bhmd,bhme->bhde", fk, v)
            num = torch.einsum("bhnd,bhde->bhne", fq, kv)
            den = torch.einsum("bhnd,bhd->bhn", fq, fk.sum(dim=-2)) if self.normalize else None
        else:
            a = fq @ fk.transpose(-1, -2)
            num = a @ v
            den = a.sum(dim=-1) if self.normalize else None
        if not self.normalize:
            return num
        if self.clamp_min is not None:
            den = den.clamp(min=self.clamp_min)
        den = den + self.eps if self.eps_policy == "add" else den.clamp(min=self.eps)
        return num / den.unsqueeze(-1)
