"""Analytic multiply-accumulate (MAC) counts and the parameter-count table, shared by every model family.

Counting convention (the one the papers' "FLOPs"/"MACs" columns use, Castling-ViT Table 2 says MACs):

* **MACs** are the multiply-accumulates of every matrix product, dot product and convolution: a product
  of an (m x k) and a (k x n) matrix is m k n MACs, a convolution producing O output elements from
  Cin/groups x KH x KW inputs each is O (Cin/groups) KH KW MACs.  Bias additions are not counted (they are
  one addition per output, folded into the accumulation as in fvcore/ptflops).
* Attention products count as matrix products: softmax attention QK^T and AV (2 N M d per head), linear
  attention K^T V and Q (K^T V) (2 N d e per head) and its normaliser phi(Q) . sum_j phi(K_j) (N d per
  head, a dot product).
* **Elementwise work is stated separately** (:func:`elementwise`-style dictionaries of the families): one
  "element op" per output element of each non-MAC stage (LayerNorm, GELU, softmax's exp, feature maps,
  residual additions, pooling, the sum over keys, shifting/padding is free).  It is a size, not a FLOP
  count: an element op may hide several arithmetic operations (LayerNorm: ~5, GELU: erf + 3).
* **FFTs** (LiSA's) are stated separately too, in MACs by :func:`fft_macs`'s convention: a length-n complex
  FFT is n/2 log2 n complex MACs of 4 real MACs each, a real-input one (rfft/irfft) half of that, n log2 n
  (refimpl/config.py ``FFT_COMPLEX_MACS_PER_POINT_STAGE``, ``COMPLEX_MAC_REAL_MACS``,
  ``FFT_REAL_INPUT_FACTOR``); a complex elementwise product counts 4 real MACs.

Every helper below returns an ``int``.  Families assemble them into ``macs(cfg, image_hw) -> dict[str,
int]`` keyed by layer group ("patch_embed", "blocks.3.attn.qkv", ...); :func:`total` sums a dict.
:func:`count_table` builds the parameter-count table of every registered model (README / docs), from the
registry data alone.

References: FLatten Tables 3-8 (FLOPs), Castling-ViT Table 2 (MACs); fvcore's counting rules.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Mapping

import numpy as np

from .. import config

__all__ = ["linear_macs", "conv2d_macs", "depthwise_conv2d_macs", "matmul_macs", "softmax_attention_macs",
           "linear_attention_macs", "mlp_macs", "fft_macs", "total", "CountGap", "count_table",
           "format_count_table"]


def _nonneg(*vals: int) -> None:
    for v in vals:
        if int(v) != v or v < 0:
            raise ValueError(f"MAC counts need non-negative integer sizes, got {vals}")


def linear_macs(tokens: int, in_features: int, out_features: int) -> int:
    """y = x W^T (+ b) on ``tokens`` rows: tokens * in * out MACs."""
    _nonneg(tokens, in_features, out_features)
    return int(tokens) * int(in_features) * int(out_features)


def conv2d_macs(out_hw: tuple[int, int], in_channels: int, out_channels: int, kernel: tuple[int, int],
                groups: int = 1) -> int:
    """A 2-D convolution: OH OW Cout (Cin / groups) KH KW MACs (per image)."""
    _nonneg(*out_hw, in_channels, out_channels, *kernel, groups)
    if in_channels % groups:
        raise ValueError(f"argument 'groups': in_channels {in_channels} not divisible by {groups}")
    return int(out_hw[0]) * int(out_hw[1]) * int(out_channels) * (int(in_channels) // int(groups)) \
        * int(kernel[0]) * int(kernel[1])


def depthwise_conv2d_macs(out_hw: tuple[int, int], channels: int, kernel: tuple[int, int]) -> int:
    """A depthwise convolution: OH OW C KH KW MACs (per image)."""
    return conv2d_macs(out_hw, channels, channels, kernel, groups=channels)


def matmul_macs(batch: int, m: int, k: int, n: int) -> int:
    """``batch`` products of (m x k) by (k x n): batch m k n MACs."""
    _nonneg(batch, m, k, n)
    return int(batch) * int(m) * int(k) * int(n)


def softmax_attention_macs(heads: int, n_q: int, n_k: int, d: int, e: int | None = None) -> int:
    """Softmax attention per image: QK^T (h N M d) and AV (h N M e)."""
    e = d if e is None else e
    return matmul_macs(heads, n_q, d, n_k) + matmul_macs(heads, n_q, n_k, e)


def linear_attention_macs(heads: int, n_q: int, n_k: int, d: int, e: int | None = None, *,
                          normaliser: bool = True) -> int:
    """Kernelized linear attention per image in the linear order: K^T V (h M d e), Q (K^T V) (h N d e) and,
    with ``normaliser``, the dot products phi(Q_i) . sum_j phi(K_j) (h N d); the key sum is elementwise."""
    e = d if e is None else e
    out = matmul_macs(heads, d, n_k, e) + matmul_macs(heads, n_q, d, e)
    if normaliser:
        out += matmul_macs(heads, n_q, d, 1)
    return out


def mlp_macs(tokens: int, dim: int, hidden: int, out: int | None = None) -> int:
    """fc1 and fc2 of a Transformer MLP."""
    return linear_macs(tokens, dim, hidden) + linear_macs(tokens, hidden, dim if out is None else out)


def fft_macs(lengths: int | Iterable[int], *, real: bool = True, transforms: int = 1) -> int:
    """Real MACs of ``transforms`` FFTs over a grid of ``lengths`` (one axis or several), by the convention of
    refimpl/config.py: a length-n complex transform is n/2 log2 n complex MACs
    (``FFT_COMPLEX_MACS_PER_POINT_STAGE``; n = the product of the lengths, the same by rows and columns),
    each ``COMPLEX_MAC_REAL_MACS`` = 4 real MACs, so 2 n log2 n; a real-input transform (rfft / irfft, forward
    or inverse alike) ``FFT_REAL_INPUT_FACTOR`` = 1/2 of that, n log2 n.  log2 is taken for any n (the usual
    proxy for mixed-radix lengths); the count is rounded to an integer once, over all ``transforms``.  FFTs
    are not in the families' default ``macs`` (LiSANet: ``macs(cfg, fft=True)`` adds them)."""
    lens = (lengths,) if isinstance(lengths, (int, np.integer)) else tuple(lengths)
    _nonneg(*lens, transforms)
    if not lens or any(int(n) < 1 for n in lens):
        raise ValueError(f"argument 'lengths': expected positive FFT lengths, got {lengths!r}")
    n = math.prod(int(t) for t in lens)
    per = config.COMPLEX_MAC_REAL_MACS * config.FFT_COMPLEX_MACS_PER_POINT_STAGE * n * math.log2(n)
    if real:
        per *= config.FFT_REAL_INPUT_FACTOR
    return int(round(int(transforms) * per))


def total(counts: Mapping[str, int]) -> int:
    """The sum of a per-layer MAC (or element-op) dictionary."""
    return int(sum(int(v) for v in counts.values()))


# ===================================================================================================
# The parameter-count table (README / docs rows come from the registry data)
# ===================================================================================================

@dataclasses.dataclass(frozen=True)
class CountGap:
    """A paper's printed parameter count that our model, built as the paper describes it, does not
    reproduce.  ``derived`` is our count from the arithmetic written in ``arithmetic`` (the test asserts the
    model's count equals it); ``reason`` says why the paper's figure cannot be reached without bending the
    architecture."""

    derived: int
    arithmetic: str
    reason: str


def _round_m(n: int, digits: int) -> float:
    # round half away from zero in decimal, as a paper's "6.19M -> 6.2M" does (Python's round() is half-even
    # on the binary value; the count is an integer, so work in integers)
    scale = 10 ** (6 - digits)
    q, r = divmod(int(n), scale)
    if 2 * r >= scale:
        q += 1
    return q / 10 ** digits


def count_table(names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """One row per registered model: name, source, the paper's figure and precision, our count for the
    registered config, our count under the config overrides with which the paper measured its figure
    (``PAPER_COUNT_OVERRIDES[name]`` in the family module, e.g. ``{"preset": "official"}``), whether it
    matches at the paper's precision, and the recorded :class:`CountGap` (``COUNT_GAPS[name]``) if not."""
    from .registry import create, entry, names as all_names, param_count

    rows = []
    for name in (all_names() if names is None else list(names)):
        e = entry(name)
        overrides = dict(getattr(e.module, "PAPER_COUNT_OVERRIDES", {}).get(name, {}))
        ours = param_count(e.config)
        cfg_paper, _ = create(name, **overrides)
        ours_paper = param_count(cfg_paper)
        gap = getattr(e.module, "COUNT_GAPS", {}).get(name)
        paper = e.paper_params_m
        match = paper is not None and _round_m(ours_paper, e.paper_precision) == round(paper, e.paper_precision)
        rows.append(dict(name=name, source=e.paper_source, paper_m=paper, precision=e.paper_precision,
                         params=ours, params_paper_setting=ours_paper, paper_setting=overrides,
                         ours_rounded=_round_m(ours_paper, e.paper_precision), match=match, gap=gap))
    return rows


def format_count_table(rows: list[dict[str, Any]] | None = None) -> str:
    """The table as Markdown (the README's parameter-count table)."""
    rows = count_table() if rows is None else rows
    lines = ["| model | paper | paper's count | ours (registered config) | ours (paper's setting) | match |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        setting = ", ".join(f"{k}={v!r}" for k, v in r["paper_setting"].items()) or "registered"
        paper = "-" if r["paper_m"] is None else f"{r['paper_m']:.{r['precision']}f}M"
        verdict = "yes" if r["match"] else ("no: see gap" if r["gap"] is not None else "NO (unexplained)")
        lines.append(f"| {r['name']} | {r['source']} | {paper} | {r['params']:,} | "
                     f"{r['params_paper_setting']:,} ({setting}) | {verdict} |")
    return "\n".join(lines)
