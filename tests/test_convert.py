"""Tests of refimpl.models.convert_state_dict: released checkpoints as they are, and twins' state_dicts.

Round trip: a reduced config's PyTorch twin gives a state_dict keyed like the reference; a *released-style*
state_dict is built from it by applying the released naming (RAVLT's ``norm1.norm.*``) and adding the
buffers the released code keeps (Swin's ``relative_position_index`` and ``attn_mask``, RAVLT's
``RoPE.angle``, BatchNorm's ``num_batches_tracked``), each built here independently of the converter (the
twin's loop-built index, Swin's region slices, the released RoPE formula evaluated by torch in float32).
Castling-DeiT (every registered one, reduced) keeps our names: its released key list is checked here against
the facts of the released files (DeiT's timm frame, the released attention's ``qkv``/``proj``/``dconv``).
Converting any of them must give exactly the twin's weights, and the reference on them the twin's logits to rounding
(every unit teacher-forced through its float64 unit bound; the twin stands for the released model).
Strictness: an unknown key, a missing key, a wrong-shaped key and a derived buffer that differs are each
named in the error.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from refimpl.twins import models as twins  # noqa: E402
from equivalence.assertions import assert_matches, compare_matches, state_dict_to_numpy  # noqa: E402
from refimpl.twins.modules.layers import relative_position_index as loop_index  # noqa: E402
from refimpl import models  # noqa: E402
from refimpl.errors import (ArgumentError, ParameterKeyError, ParameterShapeError,  # noqa: E402
                            ParameterValueError)
from refimpl.models import castling, convert, flatten, flatten_cswin, flatten_pvt, l2vit, ravlt  # noqa: E402
from refimpl.verdict import DIVERGES  # noqa: E402

FAMS = {"flatten_swin_t": flatten, "flatten_pvt_t": flatten_pvt, "flatten_pvt_v2_b0": flatten_pvt,
        "flatten_cswin_t": flatten_cswin, "l2vit_tiny": l2vit, "ravlt_t": ravlt, "castling_deit_t": castling,
        "castling_deit_b": castling}


def _reduced(name):
    fam = FAMS[name]
    return fam.reduced(models.create(name, preset="official")[0])


def _image_hw(cfg, fam):
    return tuple(cfg.img_size) if hasattr(cfg, "img_size") else fam.test_image_hw(cfg)


def _swin_mask(hp, wp, ws, shift):
    """Swin's shift mask from its region slices (independent of refimpl.layers)."""
    img = np.zeros((hp, wp))
    cnt = 0
    for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
        for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            img[hs, wsl] = cnt
            cnt += 1
    win = img.reshape(hp // ws, ws, wp // ws, ws).transpose(0, 2, 1, 3).reshape(-1, ws * ws)
    diff = win[:, None, :] - win[:, :, None]
    return torch.from_numpy(np.where(diff != 0, -100.0, 0.0).astype(np.float32))


def _released_style(cfg, sd):
    """The twin's state_dict in the released naming, with the released buffers added."""
    out = dict(sd)
    if isinstance(cfg, ravlt.RAVLTNetConfig):
        for k in list(out):
            parts = k.split(".")
            if len(parts) == 6 and parts[0] == "layers" and parts[2] == "blocks" and parts[4] in ("norm1", "norm2"):
                out[".".join(parts[:5] + ["norm", parts[5]])] = out.pop(k)
        for i, (c, h) in enumerate(zip(cfg.dims, cfg.num_heads)):
            n = c // h // 4
            angle = 1.0 / (10000 ** torch.linspace(0, 1, n))
            out[f"layers.{i}.RoPE.angle"] = angle.unsqueeze(-1).repeat(1, 2).flatten()
    if isinstance(cfg, flatten.FlattenSwinConfig):
        for i, (grid, (ws, shift), t) in enumerate(zip(cfg.stage_grids, cfg.stage_windows, cfg.attn_types)):
            hp, wp = -(-grid[0] // ws) * ws, -(-grid[1] // ws) * ws
            for j in range(cfg.depths[i]):
                if t == "S":
                    out[f"layers.{i}.blocks.{j}.attn.relative_position_index"] = loop_index(ws)
                if j % 2 and shift:
                    out[f"layers.{i}.blocks.{j}.attn_mask"] = _swin_mask(hp, wp, ws, shift)
    return out


@pytest.fixture(scope="module")
def built():
    out = {}
    for name in FAMS:
        cfg = _reduced(name)
        torch.manual_seed(0)
        net = twins.build(cfg)
        out[name] = (cfg, net.state_dict(), state_dict_to_numpy(net))
    return out


# ===================================================================================================
# Round trips
# ===================================================================================================

@pytest.mark.parametrize("name", list(FAMS))
def test_official_round_trip(name, built):
    cfg, sd, want = built[name]
    released = _released_style(cfg, sd)
    params = models.convert_state_dict(cfg, released, source="official")
    assert list(params) == list(models.param_shapes(cfg))
    for k, v in want.items():
        assert params[k].dtype == np.float64
        np.testing.assert_array_equal(params[k], v, err_msg=k)
    fam = FAMS[name]
    images = np.random.default_rng(0).standard_normal((1, cfg.in_chans, *_image_hw(cfg, fam)))
    logits = fam.forward(params, images, cfg)
    assert logits.shape == (1, cfg.num_classes) and np.isfinite(logits).all()


@pytest.mark.parametrize("name", list(FAMS))
def test_released_state_dict_gives_the_models_logits(name, built):
    """A state_dict in the released naming (with the released buffers), loaded through ``convert_state_dict`` as
    it is, gives the logits of the model that holds it - the PyTorch twin, laid out like the released module and
    loaded with the original (float32) state_dict, run in float64 - to rounding: every unit of the network
    (stem, blocks, downsamplings, head), teacher-forced from the reference's own input, matches through its
    float64 unit bound (refimpl.verdict), and end to end the logits do not diverge through the network's
    logits bound.  No released checkpoint can be downloaded here; the twin stands for the released model
    (docs: "Released checkpoints")."""
    cfg, sd, _ = built[name]
    fam = FAMS[name]
    params = models.convert_state_dict(cfg, _released_style(cfg, sd), source="official")
    net = twins.build(cfg)
    net.load_state_dict(sd)
    net = net.double().eval()
    images = np.random.default_rng(1).standard_normal((2, cfg.in_chans, *_image_hw(cfg, fam)))
    taps: dict = {}
    logits, _ = fam.run(params, images, cfg, taps=taps)
    units = fam.unit_names(cfg)
    assert units[-1] in taps and np.array_equal(taps[units[-1]], logits)
    x = images
    for unit in units:
        with torch.no_grad():
            out = net.run_unit(unit, torch.from_numpy(np.ascontiguousarray(x)))
        assert_matches(out, taps[unit], fam.unit_bound(params, unit, x, cfg, dtype="float64"), "float64",
                       name=f"{name} unit {unit}")
        x = taps[unit]
    with torch.no_grad():
        logits_t = net(torch.from_numpy(images))
    _, lbound = fam.forward_bounds(params, images, cfg, dtype="float64")
    assert compare_matches(logits_t, logits, lbound, "float64", name=f"{name} logits").verdict != DIVERGES


def test_released_logits_see_a_wrong_weight(built):
    """The comparison above can fail: the same state_dict with one LayerNorm weight of one block changed by
    1e-9 relative (a value the converter would have to alter) diverges at that block's unit."""
    cfg, sd, _ = built["ravlt_t"]
    fam = FAMS["ravlt_t"]
    params = models.convert_state_dict(cfg, _released_style(cfg, sd), source="official")
    params = dict(params)
    params["layers.1.blocks.0.norm1.weight"] = params["layers.1.blocks.0.norm1.weight"] * (1 + 1e-9)
    net = twins.build(cfg)
    net.load_state_dict(sd)
    net = net.double().eval()
    images = np.random.default_rng(1).standard_normal((1, cfg.in_chans, *_image_hw(cfg, fam)))
    taps: dict = {}
    fam.run(params, images, cfg, taps=taps)
    units = fam.unit_names(cfg)
    verdicts = {}
    for i, unit in enumerate(units):
        x = images if i == 0 else taps[units[i - 1]]
        with torch.no_grad():
            out = net.run_unit(unit, torch.from_numpy(np.ascontiguousarray(x)))
        verdicts[unit] = compare_matches(out, taps[unit], fam.unit_bound(params, unit, x, cfg, dtype="float64"),
                                         "float64", name=unit).verdict
    assert verdicts.pop("layers.1.blocks.0") == DIVERGES
    assert DIVERGES not in verdicts.values()


@pytest.mark.parametrize("name", list(FAMS))
def test_twin_identity(name, built):
    cfg, sd, want = built[name]
    params = models.convert_state_dict(cfg, sd, source="twin")
    assert set(params) == set(want)
    for k, v in want.items():
        np.testing.assert_array_equal(params[k], v, err_msg=k)
    # NumPy values are accepted too
    params2 = models.convert_state_dict(cfg, want, source="twin")
    assert all(np.array_equal(params2[k], want[k]) for k in want)


def test_official_by_registry_name_uses_the_official_preset(built):
    cfg, sd, _ = built["l2vit_tiny"]
    over = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "preset"}
    params = models.convert_state_dict("l2vit_tiny", sd, **over)
    assert set(params) == set(models.param_shapes(cfg))


# ===================================================================================================
# Strictness
# ===================================================================================================

def _ravlt_released(built):
    cfg, sd, _ = built["ravlt_t"]
    return cfg, _released_style(cfg, sd)


def test_unknown_key_is_listed(built):
    cfg, rel = _ravlt_released(built)
    rel["layers.0.blocks.0.attn.extra_weight"] = torch.zeros(3)
    with pytest.raises(ParameterKeyError, match=r"unknown 'layers\.0\.blocks\.0\.attn\.extra_weight'"):
        models.convert_state_dict(cfg, rel)


def test_our_naming_is_unknown_in_the_released_layout(built):
    cfg, rel = _ravlt_released(built)
    rel["layers.0.blocks.0.norm1.weight"] = rel.pop("layers.0.blocks.0.norm1.norm.weight")
    with pytest.raises(ParameterKeyError) as e:
        models.convert_state_dict(cfg, rel)
    msg = str(e.value)
    assert "'layers.0.blocks.0.norm1.weight' (did you mean 'layers.0.blocks.0.norm1.norm.weight'?)" in msg
    assert "missing parameters 'layers.0.blocks.0.norm1.norm.weight'" in msg


def test_missing_key_is_listed(built):
    cfg, rel = _ravlt_released(built)
    del rel["head.bias"]
    with pytest.raises(ParameterKeyError, match=r"missing parameters 'head\.bias'"):
        models.convert_state_dict(cfg, rel)


def test_missing_derived_buffer(built):
    cfg, rel = _ravlt_released(built)
    del rel["layers.2.RoPE.angle"]
    with pytest.raises(ParameterKeyError, match=r"missing derived buffers 'layers\.2\.RoPE\.angle'"):
        models.convert_state_dict(cfg, rel)
    models.convert_state_dict(cfg, rel, require_buffers=False)


def test_wrong_shape_names_both_keys(built):
    cfg, rel = _ravlt_released(built)
    w = rel["layers.1.blocks.0.norm2.norm.weight"]
    rel["layers.1.blocks.0.norm2.norm.weight"] = torch.zeros(w.shape[0] + 1)
    with pytest.raises(ParameterShapeError,
                       match=r"'layers\.1\.blocks\.0\.norm2\.norm\.weight' \(the reference's "
                             r"'layers\.1\.blocks\.0\.norm2\.weight'\): expected shape \(16,\), got \(17,\)"):
        models.convert_state_dict(cfg, rel)


def test_rope_angle_mismatch_is_named(built):
    cfg, rel = _ravlt_released(built)
    rel["layers.3.RoPE.angle"] = rel["layers.3.RoPE.angle"] * (1 + 1e-4)
    with pytest.raises(ParameterValueError, match=r"derived buffer 'layers\.3\.RoPE\.angle'"):
        models.convert_state_dict(cfg, rel)


def test_batch_counter_checked(built):
    cfg, rel = _ravlt_released(built)
    rel["norm.num_batches_tracked"] = torch.tensor(-1)
    with pytest.raises(ParameterValueError, match=r"derived buffer 'norm\.num_batches_tracked'"):
        models.convert_state_dict(cfg, rel)


def test_swin_buffers_mismatch_named(built):
    cfg, sd, _ = built["flatten_swin_t"]
    rel = _released_style(cfg, sd)
    idx_keys = sorted(k for k in rel if k.endswith("relative_position_index"))
    mask_keys = sorted(k for k in rel if k.endswith("attn_mask"))
    assert idx_keys and mask_keys
    bad = dict(rel)
    bad[idx_keys[0]] = rel[idx_keys[0]].flip(0)
    with pytest.raises(ParameterValueError, match=rf"derived buffer '{idx_keys[0]}'"):
        models.convert_state_dict(cfg, bad)
    bad = dict(rel)
    m = rel[mask_keys[-1]].clone()
    m[0, 0, -1] = -100.0 if m[0, 0, -1] == 0 else 0.0
    bad[mask_keys[-1]] = m
    with pytest.raises(ParameterValueError, match=rf"derived buffer '{mask_keys[-1]}'"):
        models.convert_state_dict(cfg, bad)
    bad = dict(rel)
    bad[mask_keys[0]] = rel[mask_keys[0]][:1]
    with pytest.raises(ParameterShapeError, match=rf"derived buffer '{mask_keys[0]}'"):
        models.convert_state_dict(cfg, bad)


def test_twin_source_strict(built):
    cfg, sd, _ = built["flatten_swin_t"]
    rel = _released_style(cfg, sd)
    with pytest.raises(ParameterKeyError, match="a buffer the reference derives"):
        models.convert_state_dict(cfg, rel, source="twin")
    bad = dict(sd)
    bad["head.weight2"] = bad["head.weight"]
    with pytest.raises(ParameterKeyError, match=r"'head\.weight2'"):
        models.convert_state_dict(cfg, bad, source="twin")


@pytest.mark.parametrize("name", ["flatten_deit_t", "lisanet_i_t", "castling_levit_128", "castling_mvitv2_t"])
def test_no_released_code(name):
    with pytest.raises(ArgumentError, match="no released code"):
        models.convert_state_dict(name, {})


def test_unknown_source():
    with pytest.raises(ArgumentError, match="argument 'source'"):
        models.convert_state_dict("ravlt_t", {}, source="timm")


# ===================================================================================================
# Full-size layouts (no weights allocated)
# ===================================================================================================

def test_full_size_swin_t_buffers():
    lay = convert.released_layout("flatten_swin_t")
    idx = [k for k in lay.derived if k.endswith("relative_position_index")]
    masks = [k for k in lay.derived if k.endswith("attn_mask")]
    # stages 3-4 softmax (6 + 2 blocks); at 224: stage 3 grid 14, window 7, odd blocks shift; stage 4 grid 7
    assert len(idx) == 8 and sorted(masks) == [f"layers.2.blocks.{j}.attn_mask" for j in (1, 3, 5)]
    assert lay.derived["layers.2.blocks.1.attn_mask"].value.shape == (4, 49, 49)
    np.testing.assert_array_equal(lay.derived["layers.2.blocks.1.attn_mask"].value,
                                  _swin_mask(14, 14, 7, 3).numpy())
    np.testing.assert_array_equal(lay.derived["layers.3.blocks.0.attn.relative_position_index"].value,
                                  loop_index(7).numpy())


@pytest.mark.parametrize("name", ["ravlt_t", "ravlt_s", "ravlt_b", "ravlt_l"])
def test_full_size_ravlt_rope_tables_accept_torch_float32(name):
    cfg = convert.official_config(name)
    lay = convert.released_layout(name)
    for i, (c, h) in enumerate(zip(cfg.dims, cfg.num_heads)):
        n = c // h // 4
        angle = (1.0 / (10000 ** torch.linspace(0, 1, n))).unsqueeze(-1).repeat(1, 2).flatten()
        convert._check_derived(f"layers.{i}.RoPE.angle", angle, lay.derived[f"layers.{i}.RoPE.angle"], "t")
        norms = [k for k in lay.renames if k.startswith(f"layers.{i}.blocks.0.norm1")]
        assert sorted(norms) == [f"layers.{i}.blocks.0.norm1.norm.bias", f"layers.{i}.blocks.0.norm1.norm.weight"]


@pytest.mark.parametrize("name", ["flatten_pvt_s", "flatten_pvt_v2_b2", "l2vit_small"])
def test_full_size_identity_layouts(name):
    lay = convert.released_layout(name)
    assert all(k == v for k, v in lay.renames.items())
    assert all(k.endswith("num_batches_tracked") for k in lay.derived)


# ===================================================================================================
# Castling-DeiT: DeiT's released frame around the released LinAngularAttention
# ===================================================================================================

def _castling_released(cfg):
    """The released key list of a Castling-DeiT written out from the released files: timm's VisionTransformer
    (DeiT) frame, each block's ``attn`` the released module (qkv Linear(C, 3C), proj, dconv Conv2d(h, h, (9, 1),
    groups=h, bias=False))."""
    c, h, hid = cfg.embed_dim, cfg.num_heads, int(cfg.embed_dim * cfg.mlp_ratio)
    gh, gw = cfg.img_size[0] // cfg.patch_size, cfg.img_size[1] // cfg.patch_size
    keys = {"cls_token": (1, 1, c), "pos_embed": (1, gh * gw + 1, c),
            "patch_embed.proj.weight": (c, cfg.in_chans, cfg.patch_size, cfg.patch_size),
            "patch_embed.proj.bias": (c,), "norm.weight": (c,), "norm.bias": (c,),
            "head.weight": (cfg.num_classes, c), "head.bias": (cfg.num_classes,)}
    for i in range(cfg.depth):
        for n in ("norm1", "norm2"):
            keys[f"blocks.{i}.{n}.weight"] = keys[f"blocks.{i}.{n}.bias"] = (c,)
        keys.update({f"blocks.{i}.attn.qkv.weight": (3 * c, c), f"blocks.{i}.attn.qkv.bias": (3 * c,),
                     f"blocks.{i}.attn.proj.weight": (c, c), f"blocks.{i}.attn.proj.bias": (c,),
                     f"blocks.{i}.attn.dconv.weight": (h, 1, 9, 1),
                     f"blocks.{i}.mlp.fc1.weight": (hid, c), f"blocks.{i}.mlp.fc1.bias": (hid,),
                     f"blocks.{i}.mlp.fc2.weight": (c, hid), f"blocks.{i}.mlp.fc2.bias": (c,)})
    return keys


@pytest.mark.parametrize("name", ["castling_deit_t", "castling_deit_b"])
def test_castling_deit_released_keys(name, built):
    cfg, sd, _ = built[name]
    want = _castling_released(cfg)
    assert convert.castling_deit_released_shapes(cfg) == want
    assert {k: tuple(v.shape) for k, v in sd.items()} == want         # the twin is laid out as released
    full = convert.official_config(name)
    lay = convert.released_layout(name)
    assert lay.derived == {} and lay.renames == {k: k for k in _castling_released(full)}
    assert lay.file.startswith("GATECH-EIC/Castling-ViT castling-vit.py")


def test_castling_deit_unknown_key_is_named(built):
    cfg, sd, _ = built["castling_deit_t"]
    rel = dict(sd)
    rel["blocks.1.attn.kq_matmul.weight"] = torch.zeros(3)
    with pytest.raises(ParameterKeyError, match=r"unknown 'blocks\.1\.attn\.kq_matmul\.weight'"):
        models.convert_state_dict(cfg, rel)
    rel = dict(sd)
    rel["blocks.0.attn.dwconv.weight"] = rel.pop("blocks.0.attn.dconv.weight")
    with pytest.raises(ParameterKeyError) as e:
        models.convert_state_dict(cfg, rel)
    assert "'blocks.0.attn.dwconv.weight' (did you mean 'blocks.0.attn.dconv.weight'?)" in str(e.value)
    assert "missing parameters 'blocks.0.attn.dconv.weight'" in str(e.value)


def test_castling_deit_wrong_shape_names_key_expected_and_given(built):
    cfg, sd, _ = built["castling_deit_t"]
    rel = dict(sd)
    rel["blocks.1.attn.dconv.weight"] = torch.zeros(2, 1, 7, 1)     # a released model built with kernel 7
    with pytest.raises(ParameterShapeError, match=r"parameter 'blocks\.1\.attn\.dconv\.weight': expected shape "
                                                  r"\(2, 1, 9, 1\), got \(2, 1, 7, 1\)"):
        models.convert_state_dict(cfg, rel)
    # the same file converts with the config it was built with
    small = dataclasses.replace(cfg, conv_kernel=7)
    rel = {k: (v[:, :, :7] if k.endswith("dconv.weight") else v) for k, v in sd.items()}
    params = models.convert_state_dict(small, rel)
    np.testing.assert_array_equal(params["blocks.0.attn.dconv.weight"], sd["blocks.0.attn.dconv.weight"][:, :, :7])


def test_castling_deit_without_qkv_bias_and_refused_conv_options(built):
    cfg, sd, _ = built["castling_deit_t"]
    nobias = dataclasses.replace(cfg, qkv_bias=False)       # the released module's own default
    rel = {k: v for k, v in sd.items() if not k.endswith("qkv.bias")}
    assert set(models.convert_state_dict(nobias, rel)) == set(rel)
    with pytest.raises(ParameterKeyError, match=r"unknown 'blocks\.0\.attn\.qkv\.bias'"):
        models.convert_state_dict(nobias, sd)
    for over in ({"conv": "none"}, {"conv_bias": True}):
        with pytest.raises(ArgumentError, match=r"bias-free \(k, 1\) token conv 'dconv'"):
            convert.released_layout(dataclasses.replace(cfg, attn_overrides=over))


def test_castling_deit_layout_refuses_a_drifted_reference(built):
    cfg = built["castling_deit_t"][0]
    shapes = dict(castling.param_shapes(cfg))
    shapes["blocks.0.attn.dconv.weight"] = (2, 1, 9, 9)
    with pytest.raises(AssertionError, match=r"'blocks\.0\.attn\.dconv\.weight'"):
        convert._castling_deit_layout(cfg, shapes)
