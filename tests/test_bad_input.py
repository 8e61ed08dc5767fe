"""Bad input gets a clear error from the refimpl.errors hierarchy (docs/guarantees.md, "Bad input").

Every case names the argument (for a parameter, its full state_dict key), what was expected and what was
given; messages never print an array (short, no "array(").  The classes are also the built-in exceptions
callers already catch (ValueError / TypeError / KeyError).  Networks: for every registered model (its
``reduced`` config, so each call fails before any computation), a misspelled, an extra, a missing and a
wrong-shaped key are each reported by their full name, with "did you mean" for the misspelling.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import refimpl.models as rm
from refimpl import layers, validation
from refimpl.attention import angular, enhanced, focused, linear, lisa, rala
from refimpl.errors import (ArgumentError, ArgumentTypeError, ParameterKeyError, ParameterShapeError,
                            ParameterTypeError, ParameterValueError, RefimplError)

RNG = np.random.default_rng(0)


def _clean(exc_info) -> str:
    """The message, checked to be short and free of array reprs; returned for further assertions."""
    msg = str(exc_info.value)
    assert len(msg) < 500, msg[:600]
    assert "array(" not in msg and "[[" not in msg, msg
    assert isinstance(exc_info.value, RefimplError)
    return msg


# ===================================================================================================
# The hierarchy
# ===================================================================================================

def test_hierarchy_keeps_the_builtin_bases_and_keyerror_prints_cleanly():
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentTypeError, TypeError)
    assert issubclass(ParameterKeyError, KeyError) and issubclass(ParameterShapeError, ValueError)
    assert issubclass(ParameterTypeError, TypeError) and issubclass(ParameterValueError, ValueError)
    for cls in (ArgumentError, ArgumentTypeError, ParameterKeyError, ParameterShapeError, ParameterTypeError,
                ParameterValueError):
        assert issubclass(cls, RefimplError)
    assert str(ParameterKeyError("missing 'a.b'")) == "missing 'a.b'"       # KeyError would quote it


# ===================================================================================================
# Scalars and configs
# ===================================================================================================

_PHI = np.abs(RNG.standard_normal((1, 1, 4, 3)))
_V = RNG.standard_normal((1, 1, 4, 3))

SCALAR_CASES = [
    ("eps=-1", lambda: linear.kernelized_attention(_PHI, _PHI, _V, eps=-1.0), ArgumentError, r"'eps'.*>= 0.*-1"),
    ("eps=nan", lambda: linear.kernelized_attention(_PHI, _PHI, _V, eps=math.nan), ArgumentError, r"'eps'.*got nan"),
    ("clamp_min=nan", lambda: linear.kernelized_attention(_PHI, _PHI, _V, clamp_min=math.nan), ArgumentError,
     r"'clamp_min'.*got nan"),
    ("layer_norm eps=-1", lambda: layers.layer_norm(_V, np.ones(3), np.zeros(3), eps=-1.0), ArgumentError,
     r"'eps'.*>= 0.*-1"),
    ("RALAConfig eps=nan", lambda: rala.RALAConfig(dim=8, num_heads=2, eps=math.nan), ArgumentError,
     r"eps'.*got nan"),
    ("rope_base=-1", lambda: rala.RALAConfig(dim=8, num_heads=2, rope=True, rope_base=-1.0), ArgumentError,
     r"rope_base'.*> 0.*-1"),
    ("lepe_kernel=2.5", lambda: rala.RALAConfig(dim=8, num_heads=2, lepe_kernel=2.5), ArgumentTypeError,
     r"lepe_kernel'.*integer.*2\.5"),
    ("lepe_kernel=4", lambda: rala.RALAConfig(dim=8, num_heads=2, lepe_kernel=4), ArgumentError,
     r"lepe_kernel'.*odd.*4"),
    ("block norm_eps=-1", lambda: rala.RAVLTBlockConfig(attn=rala.RALAConfig(dim=8, num_heads=2), norm_eps=-1.0),
     ArgumentError, r"norm_eps'.*>= 0.*-1"),
    ("block mlp_ratio=-1", lambda: rala.RAVLTBlockConfig(attn=rala.RALAConfig(dim=8, num_heads=2), mlp_ratio=-1.0),
     ArgumentError, r"mlp_ratio'.*> 0.*-1"),
    ("L2ViT mlp_ratio=-1", lambda: enhanced.L2ViTConfig(dim=8, num_heads=2, mlp_ratio=-1.0), ArgumentError,
     r"'mlp_ratio'.*> 0.*-1"),
    ("L2ViT layer_norm_eps=-1", lambda: enhanced.L2ViTConfig(dim=8, num_heads=2, layer_norm_eps=-1.0),
     ArgumentError, r"'layer_norm_eps'.*>= 0.*-1"),
    ("LiSA mlp_ratio=-1", lambda: lisa.LiSAConfig(dim=8, num_heads=2, grid=(3, 3), mlp_ratio=-1.0), ArgumentError,
     r"'mlp_ratio'.*-1"),
    ("Castling qk_norm_eps=nan", lambda: angular.CastlingConfig(dim=8, num_heads=2, qk_norm_eps=math.nan),
     ArgumentError, r"'qk_norm_eps'.*nan"),
    ("Focused eps=inf", lambda: focused.FocusedConfig(dim=8, num_heads=2, eps=math.inf), ArgumentError,
     r"'eps'.*finite.*inf"),
    ("l2vit net layer_norm_eps=-1", lambda: rm.create("l2vit_tiny", layer_norm_eps=-1.0), ArgumentError,
     r"'layer_norm_eps'.*-1"),
    ("l2vit net mlp_ratio=-1", lambda: rm.create("l2vit_tiny", mlp_ratio=-1.0), ArgumentError, r"'mlp_ratio'.*-1"),
    ("ravlt net batch_norm_eps=nan", lambda: rm.create("ravlt_t", batch_norm_eps=math.nan), ArgumentError,
     r"'batch_norm_eps'.*nan"),
    ("lisanet ln_eps=-1", lambda: rm.create("lisanet_h_t", ln_eps=-1.0), ArgumentError, r"'ln_eps'.*-1"),
    ("flatten layer_norm_eps=-1", lambda: rm.create("flatten_swin_t", layer_norm_eps=-1.0), ArgumentError,
     r"'layer_norm_eps'.*-1"),
    ("castling mlp_ratio=nan", lambda: rm.create("castling_deit_t", mlp_ratio=math.nan), ArgumentError,
     r"'mlp_ratio'.*nan"),
    ("eps a string", lambda: linear.apply_normaliser(np.ones(2), eps="1e-6"), ArgumentTypeError,
     r"'eps'.*real number.*str"),
]


@pytest.mark.parametrize("label,call,exc,pattern", SCALAR_CASES, ids=[c[0] for c in SCALAR_CASES])
def test_scalar_and_config_arguments_are_refused(label, call, exc, pattern):
    with pytest.raises(exc, match=pattern) as e:
        call()
    _clean(e)


# ===================================================================================================
# apply_normaliser, axes, taps, grids
# ===================================================================================================

@pytest.mark.parametrize("den,kind", [("abc", "<U3"), (None, "object"), (np.array([1.0, None], dtype=object), "object"),
                                      (np.array([1, 2]), "integer")], ids=["str", "None", "object", "int"])
def test_apply_normaliser_refuses_non_float_denominators(den, kind):
    with pytest.raises(ArgumentTypeError, match=rf"argument 'den': expected a real floating array.*got {kind}") as e:
        linear.apply_normaliser(den)
    _clean(e)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_apply_normaliser_promotes_to_float64(dtype):
    out = linear.apply_normaliser(np.array([0.5, 2.0], dtype=dtype), eps=0.25)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, np.array([0.75, 2.25]))


def test_resample_linear_refuses_an_axis_out_of_range():
    with pytest.raises(ArgumentError, match=r"argument 'axis': expected an axis in \[-2, 2\) of a 2-d array, got 3") as e:
        focused.resample_linear(np.ones((2, 4)), 3, axis=3)
    _clean(e)


def test_taps_must_be_a_dict():
    fcfg = focused.FocusedConfig(dim=8, num_heads=2)
    fp = focused.init_focused_params(fcfg, layout="global", n_kv=9)
    calls = [lambda: linear.kernelized_attention(_PHI, _PHI, _V, taps="abc"),
             lambda: focused.focused_linear_attention(RNG.standard_normal((1, 9, 8)), fp, fcfg, (3, 3), taps="abc"),
             lambda: rala.rala_attention(RNG.standard_normal((1, 3, 3, 8)),
                                         {k: RNG.standard_normal(s) for k, s in
                                          rala.rala_param_shapes(rala.RALAConfig(dim=8, num_heads=2)).items()},
                                         rala.RALAConfig(dim=8, num_heads=2), taps=["x"])]
    for call in calls:
        with pytest.raises(ArgumentTypeError, match=r"argument 'taps': expected None or a dict.*got (str|list)") as e:
            call()
        _clean(e)


def _lcm_params(c=8, k=3):
    cfg = enhanced.L2ViTConfig(dim=c, num_heads=2, lcm_kernel=k)
    return {key[len("local_mp."):]: v for key, v in enhanced.init_l2vit_params(cfg, "lga").items()
            if key.startswith("local_mp.")}


def test_lcm_refuses_0d_and_none_inputs_and_a_grid_that_does_not_fit():
    p = _lcm_params()
    with pytest.raises(ArgumentError, match=r"argument 'x': expected a 3-d array.*got 0-d") as e:
        enhanced.lcm(np.float64(1.0), p, (3, 3))
    _clean(e)
    with pytest.raises(ArgumentTypeError, match=r"argument 'x': expected a real floating array.*object") as e:
        enhanced.lcm(None, p, (3, 3))
    _clean(e)
    with pytest.raises(ArgumentError, match=r"argument 'x'.*dimension N is 9, not 12") as e:
        enhanced.lcm(RNG.standard_normal((1, 12, 8)), p, (3, 3))
    _clean(e)


def test_token_count_must_fill_the_grid():
    v = RNG.standard_normal((1, 2, 12, 8))
    with pytest.raises(ArgumentError, match=r"argument 'hw': expected \(H, W\) with H \* W = N = 12.*'v'.*"
                                            r"got \(3, 3\)") as e:
        focused.focused_attention(v, v, v, hw=(3, 3), dwc_weight=RNG.standard_normal((16, 1, 3, 3)))
    _clean(e)
    ccfg = angular.CastlingConfig(dim=16, num_heads=2, conv="grid2d")
    with pytest.raises(ArgumentError, match=r"argument 'hw': expected \(H, W\) with H \* W = N = 12") as e:
        angular.castling_attention(RNG.standard_normal((1, 12, 16)), angular.init_castling_params(ccfg, 0), ccfg,
                                   hw=(3, 3))
    _clean(e)


def test_batch_norm_refuses_a_negative_running_variance():
    x = RNG.standard_normal((1, 2, 3, 3))
    with pytest.raises(ArgumentError, match=r"argument 'running_var'.*>= 0.*1 of 2.*-0\.5") as e:
        layers.batch_norm2d(x, np.ones(2), np.zeros(2), np.zeros(2), np.array([1.0, -0.5]))
    _clean(e)


# ===================================================================================================
# Parameter mappings of the attention modules
# ===================================================================================================

def test_attention_modules_list_key_problems_by_name_without_arrays():
    fcfg = focused.FocusedConfig(dim=8, num_heads=2)
    fp = focused.init_focused_params(fcfg, layout="global", n_kv=9)
    x = RNG.standard_normal((1, 9, 8))
    with pytest.raises(ParameterKeyError, match=r"focused_linear_attention:.*missing 'proj.weight'") as e:
        focused.focused_linear_attention(x, {k: v for k, v in fp.items() if k != "proj.weight"}, fcfg, (3, 3))
    assert "dwc.weight" not in _clean(e)                 # the present keys are not dumped
    bad = {("dwc.bais" if k == "dwc.bias" else k): v for k, v in fp.items()}
    with pytest.raises(ParameterKeyError, match=r"unexpected 'dwc.bais' \(did you mean 'dwc.bias'\?\)") as e:
        focused.focused_linear_attention(x, bad, fcfg, (3, 3))
    _clean(e)
    with pytest.raises(ParameterShapeError, match=r"parameter 'q.weight': expected shape \(8, 8\), got \(9, 8\)") as e:
        focused.focused_linear_attention(x, {**fp, "q.weight": np.zeros((9, 8))}, fcfg, (3, 3))
    _clean(e)
    with pytest.raises(ParameterTypeError, match=r"parameter 'q.weight': expected a real floating array.*int") as e:
        focused.focused_linear_attention(x, {**fp, "q.weight": np.zeros((8, 8), dtype=np.int64)}, fcfg, (3, 3))
    _clean(e)
    rcfg = rala.RALAConfig(dim=8, num_heads=2)
    rp = {k: RNG.standard_normal(s) for k, s in rala.rala_param_shapes(rcfg).items()}
    with pytest.raises(ParameterKeyError, match=r"rala_attention:.*unexpected 'extra.weight'") as e:
        rala.rala_attention(RNG.standard_normal((1, 3, 3, 8)), {**rp, "extra.weight": np.zeros(3)}, rcfg)
    _clean(e)
    ccfg = angular.CastlingConfig(dim=16, num_heads=2, qkv_bias=True)
    cp = angular.init_castling_params(ccfg, 0)
    with pytest.raises(ParameterShapeError, match=r"parameter 'qkv.weight': expected shape \(48, 16\), "
                                                  r"got \(49, 16\)") as e:
        angular.castling_attention(RNG.standard_normal((1, 9, 16)), {**cp, "qkv.weight": np.zeros((49, 16))}, ccfg)
    _clean(e)
    p = _lcm_params()
    with pytest.raises(ParameterValueError, match=r"lcm: parameter 'bn.running_var'.*>= 0") as e:
        enhanced.lcm(RNG.standard_normal((1, 9, 8)), {**p, "bn.running_var": -np.ones(8)}, (3, 3))
    _clean(e)
    scfg = lisa.LiSAConfig(dim=8, num_heads=2, grid=(3, 3))
    sp = lisa.init_params(lisa.lisa_param_shapes(scfg))
    with pytest.raises(ParameterKeyError, match=r"lisa_attention:.*missing 'weight_a'") as e:
        lisa.lisa_attention(RNG.standard_normal((1, 9, 8)), {k: v for k, v in sp.items() if k != "weight_a"}, scfg)
    _clean(e)


def test_buffers_num_batches_tracked_optional_derived_buffers_named():
    expected = {"bn.weight": (2,), "bn.running_var": (2,), "proj.weight": (2, 2)}
    good = {"bn.weight": np.ones(2), "bn.running_var": np.ones(2), "proj.weight": np.eye(2)}
    assert validation.check_params({**good, "bn.num_batches_tracked": np.array(7)}, expected, where="t") is not None
    with pytest.raises(ParameterValueError, match=r"'bn.num_batches_tracked'.*non-negative integral scalar") as e:
        validation.check_params({**good, "bn.num_batches_tracked": np.array(-1.5)}, expected, where="t")
    _clean(e)
    with pytest.raises(ParameterKeyError, match=r"'attn.relative_position_index' \(a buffer the reference derives") as e:
        validation.check_params({**good, "attn.relative_position_index": np.zeros((4, 4))}, expected, where="t")
    _clean(e)
    with pytest.raises(ArgumentTypeError, match=r"argument 'params': expected a mapping.*got list") as e:
        validation.check_params([1, 2], expected, where="t")
    _clean(e)


# ===================================================================================================
# Every registered network: misspelled, extra, missing and wrong-shaped keys by their full names
# ===================================================================================================

def _small(name):
    mod = rm.family_of(name)
    cfg = mod.reduced(rm.create(name)[0])
    hw = getattr(cfg, "img_size", None) or getattr(cfg, "image_size", None) or (15, 13)
    images = RNG.standard_normal((1, cfg.in_chans) + tuple(hw))
    return mod, cfg, mod.init_params(cfg, np.random.default_rng(0)), images


@pytest.mark.parametrize("name", rm.names())
def test_every_network_reports_bad_keys_by_full_name(name):
    mod, cfg, params, images = _small(name)
    keys = sorted(params)
    bias = [k for k in keys if k.endswith(".bias") and k.count(".") >= 2][len(keys) // 7 % 3]
    typo = bias[:-len("bias")] + "bais"
    misspelled = {(typo if k == bias else k): v for k, v in params.items()}
    with pytest.raises(ParameterKeyError, match=rf"unexpected '{typo}' \(did you mean '{bias}'\?\); "
                                                rf"missing '{bias}'") as e:
        mod.forward(misspelled, images, cfg)
    _clean(e)
    with pytest.raises(ParameterKeyError, match=r"unexpected 'blocks\.99\.attn\.extra\.weight'") as e:
        mod.forward({**params, "blocks.99.attn.extra.weight": np.zeros(3)}, images, cfg)
    _clean(e)
    gone = keys[len(keys) // 2]
    with pytest.raises(ParameterKeyError, match=rf"missing '{gone}'") as e:
        mod.forward({k: v for k, v in params.items() if k != gone}, images, cfg)
    _clean(e)
    wrong = [k for k in keys if np.ndim(params[k]) == 2][-1]
    shape = params[wrong].shape
    got = (shape[0] + 1,) + shape[1:]
    with pytest.raises(ParameterShapeError, match=rf"parameter '{wrong}': expected shape \({shape[0]}, {shape[1]}\), "
                                                  rf"got \({got[0]}, {got[1]}\)") as e:
        mod.forward({**params, wrong: np.zeros(got)}, images, cfg)
    _clean(e)
