"""Stage-wise (teacher-forced) verdicts of every attention module at its network's real size, in every precision.

The whole-module bounds are not conclusive everywhere: for FLatten-PVT stage 1 (C = 64, one head, 56 x 56 tokens,
sr = 8), propagating every stage's rounding through the Jacobians in absolute value (the sr conv's 4097-term
sums, its LayerNorm, the kv projection, f_p) gives a relative bound of 23 in float32, 140 in float16 and 1270
in bfloat16; LiSA's carries the FFTs' norm-wise bound through its contraction (4.2 in float32); in half
precision every module's is void (docs/verdict.md).  Compared stage by stage, each stage evaluated on the tested
code's own inputs to it (refimpl.verdict.compare_stages and the modules' stage lists), with half-precision sums
accumulated in float32 (config.ACCUMULATION_FORMAT), every stage's bound is conclusive: each twin must match in
float32, float16 and bfloat16, on the CPU and, where there is one, on CUDA (cuBLAS/cuDNN half-precision kernels
accumulating in float32, the case the mixed-precision model is for) (FLatten PVT and Swin layouts, Swin's softmax window attention, L2ViT, RALA,
LiSA, Castling), and a planted batch-state bug (item 0's attention reads item 1's K and V) must diverge, at the
stage "attention".
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from equivalence.assertions import (QKV_PROJ_POINTS, capture, load_numpy_state, round_params, stage_ensemble, to_torch,
                                    torch_dtype)
from refimpl.twins.modules import angular as t_ang
from refimpl.twins.modules import enhanced as t_enh
from refimpl.twins.modules import focused as t_foc
from refimpl.twins.modules import lisa as t_lisa
from refimpl.twins.modules import rala as t_rala
from refimpl.twins.modules import softmax as t_soft
from refimpl import config, layers, numerics
from refimpl import models
from refimpl.attention import angular as r_ang
from refimpl.attention import enhanced as r_enh
from refimpl.attention import focused as r_foc
from refimpl.attention import lisa as r_lisa
from refimpl.attention import rala as r_rala
from refimpl.attention import softmax as r_soft
from refimpl.models import common as m_common
from refimpl.verdict import DIVERGES, INCONCLUSIVE, MATCH

SIDE, BATCH = 56, 2
DTYPES = ["float32", "float16", "bfloat16"]


@contextlib.contextmanager
def _swapped_batch_state():
    """The planted bug: item 0's attention uses item 1's K and V (inside attend(): its inputs, the features,
    are right; its state is not)."""
    orig = t_foc.attend

    def attend(q, k, v, *args, **kwargs):
        return orig(q, torch.cat([k[1:2], k[1:]]), torch.cat([v[1:2], v[1:]]), *args, **kwargs)

    t_foc.attend = attend
    try:
        yield
    finally:
        t_foc.attend = orig


def _verdict(stages, tensors_of, dtype_name, tested=None):
    """The stage-wise verdict of one run of a twin: ``tensors_of(force=None)`` runs it and returns its stage
    tensors; each stage's ensemble is the NumPy naive run in T and the twin under refimpl.ensemble's variants,
    teacher-forced on the tested tensors (``tested``, default one run of ``tensors_of``)."""
    tested = tensors_of() if tested is None else tested
    return numerics.compare_stages(stages, tested, dtype_name, naive=numerics.naive_same_precision,
                                   ensembles=stage_ensemble(tensors_of, tested))


def _stagewise(module, run, stages, dtype_name):
    return _verdict(stages, lambda force=None: t_foc.stage_tensors(module, run, force=force), dtype_name)


def _pvt(dtype_name, device="cpu"):
    cfg = r_foc.FocusedConfig.preset("official", dim=64, num_heads=1, sr_ratio=8, kernel_size=5)
    n_kv = (SIDE // 8) ** 2
    params = round_params(r_foc.init_focused_params(cfg, layout="global", n_kv=n_kv, seed=0), dtype_name)
    x = numerics.round_to(np.random.default_rng(1).standard_normal((BATCH, SIDE * SIDE, cfg.dim)), dtype_name)
    m = t_foc.FocusedLinearAttention(cfg, n_kv).to(device=device, dtype=torch_dtype(dtype_name))
    load_numpy_state(m, params)
    xt = to_torch(x, dtype_name, device)
    stages = r_foc.focused_linear_attention_stages(params, cfg, (SIDE, SIDE), fine=True)
    return m.eval(), (lambda: m(xt, (SIDE, SIDE))), stages


def _swin(dtype_name, device="cpu"):
    cfg = r_foc.FocusedConfig.preset("official", dim=96, num_heads=3, kernel_size=5)
    params = round_params(r_foc.init_focused_params(cfg, layout="window", n_kv=49, seed=0), dtype_name)
    x = numerics.round_to(np.random.default_rng(2).standard_normal((BATCH, SIDE * SIDE, cfg.dim)), dtype_name)
    m = t_foc.FocusedWindowAttention(cfg, 7).to(device=device, dtype=torch_dtype(dtype_name))
    load_numpy_state(m, params)
    xt = to_torch(x, dtype_name, device)
    stages = r_foc.focused_window_attention_stages(params, cfg, (SIDE, SIDE), window_size=7, shift=3, fine=True)
    return m.eval(), (lambda: m(xt, (SIDE, SIDE), shift=3)), stages


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["pvt", "swin"])
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_flatten_stagewise_matches_at_real_size(layout, dtype_name, device):
    m, run, stages = (_pvt if layout == "pvt" else _swin)(dtype_name, device)
    report = _stagewise(m, run, stages, dtype_name)
    assert report.verdict == MATCH, str(report)


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_swin_softmax_window_stagewise_matches_at_real_size(dtype_name, device):
    """Swin's softmax window attention (swin preset, C 96, 3 heads, 7 x 7 windows of 56 x 56, shift 3): qkv, the
    softmax core with the relative-position bias and the shift mask, proj."""
    c, heads, ws, shift = 96, 3, 7, 3
    opts = dict(r_soft.WINDOW_PRESETS["swin"])
    m = t_soft.WindowAttention(c, heads, ws, shift=shift, **opts)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    std = config.NET_INIT_STD_FC
    params = round_params(m_common.init_from_shapes(shapes, np.random.default_rng(0), special={
        "relative_position_bias_table": lambda shp, r: std * r.standard_normal(shp)}), dtype_name)
    m = m.to(device=device, dtype=torch_dtype(dtype_name))
    load_numpy_state(m, params)
    x = numerics.round_to(np.random.default_rng(3).standard_normal((BATCH, SIDE, SIDE, c)), dtype_name)
    xt = to_torch(x, dtype_name, device)
    m.eval()
    stages = r_soft.window_attention_stages(params, (SIDE, SIDE), num_heads=heads, window_size=ws, shift=shift,
                                            **opts)
    report = _verdict(stages, lambda force=None: capture(m, lambda: m(xt), QKV_PROJ_POINTS, force=force), dtype_name)
    assert report.verdict == MATCH, str(report)


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_l2vit_attention_stagewise_matches_at_real_size(dtype_name, device):
    """L2ViT's enhanced linear attention (paper preset, C 96, 3 heads, 56 x 56): qkv, the core (ReLU features,
    clamped normaliser, learnable scale), proj."""
    cfg = r_enh.L2ViTConfig.preset("paper", dim=96, num_heads=3)
    params = round_params(layers.subparams(r_enh.init_l2vit_params(cfg, "lga", seed=0), "attn"), dtype_name)
    m = t_enh.EnhancedLinearAttention(cfg).to(device=device, dtype=torch_dtype(dtype_name))
    load_numpy_state(m, params)
    x = numerics.round_to(np.random.default_rng(4).standard_normal((BATCH, SIDE * SIDE, cfg.dim)), dtype_name)
    xt = to_torch(x, dtype_name, device)
    m.eval()
    report = _verdict(r_enh.enhanced_attention_stages(params, cfg),
                      lambda force=None: capture(m, lambda: m(xt), QKV_PROJ_POINTS, force=force), dtype_name)
    assert report.verdict == MATCH, str(report)


@pytest.mark.slow
@pytest.mark.parametrize("preset,layout", [("official", "channels_first"), ("paper", "tokens")])
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_rala_attention_stagewise_matches_at_real_size(preset, layout, dtype_name, device):
    """RALA (C 64, 1 head, 56 x 56): the fused projection, the reweighted core (Eq. 2-4), LePE, the gate
    (Eq. 6), the output projection, with the core cut into alpha, the weighted keys, numerator, denominator and
    their quotient."""
    # token_scaling "mean" in both: without the released code's 1/N scaling, the paper's sums over the 3136 tokens
    # overflow float16's range (65504) and the module computes nothing in that precision (the next test).
    cfg = r_rala.RALAConfig.preset(preset, dim=64, num_heads=1, layout=layout, token_scaling="mean")
    params = round_params(m_common.init_from_shapes(r_rala.rala_param_shapes(cfg), np.random.default_rng(0)),
                          dtype_name)
    m = t_rala.RALAttention(cfg).to(device=device, dtype=torch_dtype(dtype_name))
    load_numpy_state(m, params)
    shape = (BATCH, cfg.dim, SIDE, SIDE) if layout == "channels_first" else (BATCH, SIDE, SIDE, cfg.dim)
    x = numerics.round_to(np.random.default_rng(5).standard_normal(shape), dtype_name)
    xt = to_torch(x, dtype_name, device)
    m.eval()
    got = t_rala.stage_tensors(m, lambda: m(xt), (SIDE, SIDE))
    report = _verdict(r_rala.rala_attention_stages(params, cfg, (SIDE, SIDE), fine=True),
                      lambda force=None: t_rala.stage_tensors(m, lambda: m(xt), (SIDE, SIDE), force=force),
                      dtype_name, tested=got)
    assert report.verdict == MATCH, str(report)
    # The coarse cut (the core as one stage from exact q, k, v through kappa, the alpha softmax, RoPE and both
    # contractions) is conclusive too: in half precision the core's deterministic bound reaches the output's size,
    # its l2 coefficient (rala_bounds._core_sigma) does not (relative bound 0.11 / 0.87 official, 0.04 / 0.33 paper, in
    # float16 / bfloat16).
    coarse = numerics.compare_stages(r_rala.rala_attention_stages(params, cfg, (SIDE, SIDE)), got, dtype_name)
    assert coarse.verdict == MATCH, str(coarse)


@pytest.mark.slow
def test_rala_paper_sums_beyond_float16_range_are_inconclusive(device):
    """The paper's RALA (no 1/N token scaling) at 56 x 56 in float16: the normaliser's sum over 3136 tokens exceeds
    65504, the twin's output is then 0, and so is the naive float16 run's.  Nothing diverges, but the stage-wise
    verdict must not be "match": the denominator's slots are beyond float16's range and unchecked."""
    cfg = r_rala.RALAConfig.preset("paper", dim=64, num_heads=1, layout="tokens")
    params = round_params(m_common.init_from_shapes(r_rala.rala_param_shapes(cfg), np.random.default_rng(0)),
                          "float16")
    m = t_rala.RALAttention(cfg).to(device=device, dtype=torch.float16)
    load_numpy_state(m, params)
    x = numerics.round_to(np.random.default_rng(5).standard_normal((BATCH, SIDE, SIDE, cfg.dim)), "float16")
    xt = to_torch(x, "float16", device)
    got = t_rala.stage_tensors(m.eval(), lambda: m(xt), (SIDE, SIDE))
    report = numerics.compare_stages(r_rala.rala_attention_stages(params, cfg, (SIDE, SIDE), fine=True), got,
                                     "float16", naive=numerics.naive_same_precision)
    den = next(r for r in report.stages if r.name == "denominator")
    assert report.verdict == INCONCLUSIVE and den.verdict == INCONCLUSIVE, str(report)
    assert any("beyond float16's range" in r for r in den.reasons), str(den)


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_lisa_attention_stagewise_matches_at_real_size(dtype_name, device):
    """LiSA (paper preset, LiSANet-H-T stage 1: C 64, 4 heads, D 8, 56 x 56), the fine stages: qkv, the L2
    normalisations, the two FFT convolutions with their biases, the contraction of Eq. 10, proj.  The whole
    core's bound (norm-wise FFT bound carried through the contraction) is inconclusive even in float32.  torch
    has no half-precision CPU FFT, and cuFFT's is for powers of two only: in half precision the twin's FFTs run
    in float32 and round to T (autocast's rule, the accumulation format of config.ACCUMULATION_FORMAT)."""
    cfg = r_lisa.LiSAConfig.preset("paper", dim=64, num_heads=4, grid=(SIDE, SIDE), latent=8)
    params = round_params(r_lisa.init_params(r_lisa.lisa_param_shapes(cfg), seed=0), dtype_name)
    m = t_lisa.from_config(cfg).to(device=device, dtype=torch_dtype(dtype_name))
    load_numpy_state(m, params)
    x = numerics.round_to(np.random.default_rng(6).standard_normal((BATCH, cfg.num_tokens, cfg.dim)), dtype_name)
    xt = to_torch(x, dtype_name, device)
    orig = t_lisa.fft_convolve

    def in_float32(xx, kernel, grid, lengths, transform="rfft"):
        return orig(xx.float(), kernel.float(), grid, lengths, transform).to(xx.dtype)

    t_lisa.fft_convolve = orig if dtype_name == "float32" else in_float32
    m.eval()
    try:
        report = _verdict(r_lisa.lisa_attention_stages(params, cfg, fine=True),
                          lambda force=None: t_lisa.stage_tensors(m, lambda: m(xt), force=force), dtype_name)
    finally:
        t_lisa.fft_convolve = orig
    assert report.verdict == MATCH, str(report)


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_castling_attention_stagewise_matches_at_real_size(dtype_name, device):
    """Castling-ViT attention (castling_deit_t's layer: C 192, 3 heads, 14 x 14, eval): qkv, the linear-angular
    core (Eq. 9-10 with the depthwise conv of V), proj."""
    side = 14
    cfg = models.entry("castling_deit_t").config.attention_config()
    params = round_params(r_ang.init_castling_params(cfg, 0), dtype_name)
    m = t_ang.CastlingAttention(cfg).to(device=device, dtype=torch_dtype(dtype_name))
    load_numpy_state(m, params)
    x = numerics.round_to(np.random.default_rng(7).standard_normal((BATCH, side * side, cfg.dim)), dtype_name)
    xt = to_torch(x, dtype_name, device)
    m.eval()
    report = _verdict(r_ang.castling_attention_stages(params, cfg, hw=(side, side)),
                      lambda force=None: capture(m, lambda: m(xt, hw=(side, side)), QKV_PROJ_POINTS, force=force),
                      dtype_name)
    assert report.verdict == MATCH, str(report)


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_flatten_pvt_batch_state_bug_diverges_at_attention(dtype_name, device):
    m, run, stages = _pvt(dtype_name, device)
    with _swapped_batch_state():
        buggy = t_foc.stage_tensors(m, run)
    # the ensemble: our correct twin, teacher-forced on the buggy port's tensors (as a verifier would run it)
    report = _verdict(stages, lambda force=None: t_foc.stage_tensors(m, run, force=force), dtype_name, tested=buggy)
    assert report.verdict == DIVERGES and report.first_divergence == "attention", str(report)


def test_stagewise_needs_every_tensor():
    cfg = r_foc.FocusedConfig.preset("official", dim=16, num_heads=1, sr_ratio=2, kernel_size=3)
    params = r_foc.init_focused_params(cfg, layout="global", n_kv=4, seed=0)
    stages = r_foc.focused_linear_attention_stages(params, cfg, (4, 4))
    with pytest.raises(KeyError, match="stage 'q' needs tensor 'q'"):
        numerics.compare_stages(stages, {"x": np.zeros((1, 16, 16))}, "float32")


def _small_twins():
    """Small FLatten-PVT, RALA (both layouts) and LiSA twins in float32: name -> (tensors_of(force=None), the
    module's fine stage list)."""
    out = {}
    cfg = r_foc.FocusedConfig.preset("official", dim=16, num_heads=2, sr_ratio=2, kernel_size=3)
    params = round_params(r_foc.init_focused_params(cfg, layout="global", n_kv=16, seed=0), "float32")
    m = t_foc.FocusedLinearAttention(cfg, 16).eval()
    load_numpy_state(m, params)
    x = to_torch(np.random.default_rng(8).standard_normal((2, 64, 16)), "float32", "cpu")
    out["flatten_pvt"] = (lambda force=None: t_foc.stage_tensors(m, lambda: m(x, (8, 8)), force=force),
                          r_foc.focused_linear_attention_stages(params, cfg, (8, 8), fine=True))
    for preset, layout in (("official", "channels_first"), ("paper", "tokens")):
        rcfg = r_rala.RALAConfig.preset(preset, dim=16, num_heads=2, layout=layout)
        rp = round_params(m_common.init_from_shapes(r_rala.rala_param_shapes(rcfg), np.random.default_rng(1)),
                          "float32")
        rm = t_rala.RALAttention(rcfg).eval()
        load_numpy_state(rm, rp)
        shape = (2, 16, 6, 6) if layout == "channels_first" else (2, 6, 6, 16)
        rx = to_torch(np.random.default_rng(9).standard_normal(shape), "float32", "cpu")
        out[f"rala_{layout}"] = (lambda force=None, rm=rm, rx=rx: t_rala.stage_tensors(rm, lambda: rm(rx), (6, 6),
                                                                                        force=force),
                                 r_rala.rala_attention_stages(rp, rcfg, (6, 6), fine=True))
    lcfg = r_lisa.LiSAConfig.preset("paper", dim=16, num_heads=2, grid=(4, 4), latent=4)
    lp = round_params(r_lisa.init_params(r_lisa.lisa_param_shapes(lcfg), seed=0), "float32")
    lm = t_lisa.from_config(lcfg).eval()
    load_numpy_state(lm, lp)
    lx = to_torch(np.random.default_rng(10).standard_normal((2, 16, 16)), "float32", "cpu")
    out["lisa"] = (lambda force=None: t_lisa.stage_tensors(lm, lambda: lm(lx), force=force),
                   r_lisa.lisa_attention_stages(lp, lcfg, fine=True))
    return out


#: Where a twin's data flow differs from its stage list: RALA's twin forms the weighted keys from the softmax of
#: the logits, (kappa(K) softmax) N as the released code does, so it reads "scores" there and records alpha
#: without going on with it (the k_weighted stage's bound allows alpha's own rounding).
_RALA_FLOW = {"reads": {"scores": {"k_weighted"}}, "recorded_only": {"alpha"}}
TWIN_FLOW = {"rala_channels_first": _RALA_FLOW, "rala_tokens": _RALA_FLOW}


@pytest.mark.parametrize("name", ["flatten_pvt", "rala_channels_first", "rala_tokens", "lisa"])
def test_forcing_a_stage_feeds_its_value_downstream(name):
    """Teacher forcing (equivalence.assertions.capture's ``force``), the basis of the stage ensembles: forced with
    its own tensors a twin records them again bit for bit; with one stage's tensor perturbed and every other
    forced, that stage is still recorded as computed, a stage that consumes it changes, and no stage that does
    not list it among its inputs changes (the stage lists may list more inputs than a twin reads)."""
    tensors_of, stages = _small_twins()[name]
    tested = tensors_of()
    again = tensors_of(force=tested)
    for st in stages:
        assert torch.equal(again[st.name], tested[st.name]), st.name
    for st in stages[:-1]:
        perturbed = dict(tested)
        perturbed[st.name] = tested[st.name] * 1.5 + 0.25
        got = tensors_of(force=perturbed)
        changed = {o.name for o in stages if not torch.equal(got[o.name], tested[o.name])}
        flow = TWIN_FLOW.get(name, {})
        consumers = {o.name for o in stages if st.name in o.inputs} | flow.get("reads", {}).get(st.name, set())
        assert changed <= consumers, f"forcing {st.name!r} changed {sorted(changed - consumers)}"
        if st.name not in flow.get("recorded_only", set()):
            assert changed, f"forcing {st.name!r} changed none of its consumers {sorted(consumers)}"


def test_forcing_checks_the_shape():
    tensors_of, _ = _small_twins()["flatten_pvt"]
    tested = tensors_of()
    with pytest.raises(ValueError, match="'phi_q' has shape"):
        tensors_of(force={"phi_q": tested["phi_q"][:1]})
