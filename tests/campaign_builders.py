"""Small valid calls of every public function swept by tests/test_campaign.py.

``BUILDERS[qualname]`` is a function of no argument returning the keyword arguments of one small, valid call
of that function (every argument passed by name, so the campaign can corrupt one at a time).  Arrays are
seeded standard-normal float64 of a few elements; parameters come from the modules' own initialisers.
``ALLOWED_NONFINITE`` lists the functions whose *valid* call may legitimately return a non-finite value.
"""

from __future__ import annotations

import numpy as np

from refimpl import layers, numerics, toeplitz
from refimpl.attention import angular, enhanced, focused, linear, lisa, rala, softmax


def _r(*shape: int, seed: int = 0, pos: bool = False) -> np.ndarray:
    a = np.random.default_rng(seed + 7 * len(shape) + sum(shape)).standard_normal(shape)
    return np.abs(a) + 0.1 if pos else a


def _unit(*shape: int, seed: int = 0) -> np.ndarray:
    """Entries in (-0.9, 0.9): arcsin-series arguments."""
    return 0.9 * np.tanh(_r(*shape, seed=seed))


# --- configurations and parameters ---------------------------------------------------------------

def _fcfg():
    # eps > 0: the paper preset's eps = 0 makes a query whose features are all zero after the ReLU 0/0 (the
    # documented undefined case, NaN), which the shifted window layout meets at this size
    return focused.FocusedConfig(dim=8, num_heads=2, kernel_size=3, eps=1e-6)


def _ecfg():
    return enhanced.L2ViTConfig(dim=8, num_heads=2, lcm_kernel=3, window_size=2)


def _ccfg():
    return angular.CastlingConfig(dim=8, num_heads=2)


def _lcfg():
    return lisa.LiSAConfig(dim=8, num_heads=2, grid=(3, 3))


def _scfg():
    return lisa.SAConfig(dim=8, num_heads=2, grid=(3, 3))


def _rcfg():
    return rala.RALAConfig(dim=8, num_heads=2)


def _bcfg():
    return rala.RAVLTBlockConfig(attn=_rcfg())


def _lcm_params():
    return {k[len("local_mp."):]: v for k, v in enhanced.init_l2vit_params(_ecfg(), "lga").items()
            if k.startswith("local_mp.")}


def _rand_params(shapes, seed=3):
    return {k: _r(*s, seed=seed + i) * 0.3 for i, (k, s) in enumerate(sorted(shapes.items()))}


def _bn_params(shapes, seed=3):
    p = _rand_params(shapes, seed)
    for k in p:
        if k.endswith("running_var"):
            p[k] = np.abs(p[k]) + 0.5
    return p


def _window_p(c=4, heads=2, ws=2):
    return {"qkv.weight": _r(3 * c, c), "qkv.bias": _r(3 * c), "proj.weight": _r(c, c), "proj.bias": _r(c),
            "relative_position_bias_table": _r((2 * ws - 1) ** 2, heads)}


def _mlp_p(c=4, hidden=6):
    return {"fc1.weight": _r(hidden, c), "fc1.bias": _r(hidden), "fc2.weight": _r(c, hidden), "fc2.bias": _r(c)}


def _merge_p(c=4):
    return {"norm.weight": 1 + 0.1 * _r(4 * c), "norm.bias": _r(4 * c), "reduction.weight": _r(2 * c, 4 * c)}


def _q3(seed=0):
    return _r(1, 2, 9, 4, seed=seed)


def _sa_terms():
    n, d = 9, 4
    return dict(q=_r(1, 2, n, d), k=_r(1, 2, n, d, seed=1), v=_r(1, 2, n, d, seed=2),
                ra_tilde=_r(n, n, d, 2, seed=3), rb=_r(n, n, 2, seed=4), bias_a=_r(d, 2, seed=5), bias_b=_r(d, 2, seed=6))


def _lisa_core():
    n, d, g = 9, 4, (3, 3)
    return dict(q=_r(1, 2, n, d), k=_r(1, 2, n, d, seed=1), v=_r(1, 2, n, d, seed=2),
                weight_a=_r(9, 4, 2, seed=3), weight_b=_r(9, 2, seed=4), bias_a=_r(d, 2, seed=5),
                bias_b=_r(d, 2, seed=6), grid=g)


F32 = np.float32

BUILDERS = {
    # --- refimpl.layers ---
    "layers.subparams": lambda: dict(params={"a.w": _r(2), "b.w": _r(2)}, prefix="a"),
    "layers.linear": lambda: dict(x=_r(2, 3, 4), weight=_r(5, 4), bias=_r(5)),
    "layers.linear_bound": lambda: dict(x=_r(2, 3, 4), weight=_r(5, 4), bias=_r(5)),
    "layers.layer_norm": lambda: dict(x=_r(2, 3, 4), weight=_r(4), bias=_r(4), eps=1e-5),
    "layers.layer_norm_bound": lambda: dict(x=_r(2, 3, 4), weight=_r(4), bias=_r(4), eps=1e-5, dtype=F32),
    "layers.layer_norm_cf": lambda: dict(x=_r(1, 4, 3, 3), weight=_r(4), bias=_r(4), eps=1e-5),
    "layers.layer_norm_cf_bound": lambda: dict(x=_r(1, 4, 3, 3), weight=_r(4), bias=_r(4), eps=1e-5),
    "layers.batch_norm2d": lambda: dict(x=_r(1, 2, 3, 3), weight=_r(2), bias=_r(2), running_mean=_r(2),
                                        running_var=_r(2, pos=True), eps=1e-5),
    "layers.batch_norm2d_bound": lambda: dict(x=_r(1, 2, 3, 3), weight=_r(2), bias=_r(2), running_mean=_r(2),
                                              running_var=_r(2, pos=True), eps=1e-5),
    "layers.gelu": lambda: dict(x=_r(2, 3), approximate="none"),
    "layers.gelu_bound": lambda: dict(x=_r(2, 3), approximate="none"),
    "layers.l2_normalize": lambda: dict(x=_r(2, 3, 4), eps=1e-12, policy="clamp"),
    "layers.l2_normalize_bound": lambda: dict(x=_r(2, 3, 4), eps=1e-12, policy="clamp"),
    "layers.conv2d": lambda: dict(x=_r(1, 2, 4, 4), weight=_r(4, 2, 3, 3), bias=_r(4), stride=1, padding=1,
                                  groups=1, dilation=1),
    "layers.conv2d_bound": lambda: dict(x=_r(1, 2, 4, 4), weight=_r(4, 2, 3, 3), bias=_r(4), stride=1, padding=1,
                                        groups=1, dilation=1),
    "layers.conv_padding": lambda: dict(padding=1, kernel=(3, 3), stride=(1, 1), dilation=(1, 1)),
    "layers.depthwise_conv2d": lambda: dict(x=_r(1, 2, 4, 4), weight=_r(2, 1, 3, 3), bias=_r(2), stride=1,
                                            padding=1, dilation=1),
    "layers.depthwise_conv2d_bound": lambda: dict(x=_r(1, 2, 4, 4), weight=_r(2, 1, 3, 3), bias=_r(2), stride=1,
                                                  padding=1, dilation=1),
    "layers.mlp": lambda: dict(x=_r(2, 3, 4), p=_mlp_p(), approximate="none"),
    "layers.mlp_bound": lambda: dict(x=_r(2, 3, 4), p=_mlp_p(), approximate="none"),
    "layers.pad_to_multiple": lambda: dict(x=_r(1, 3, 3, 2), ws=2),
    "layers.window_partition": lambda: dict(x=_r(1, 4, 4, 2), ws=2),
    "layers.window_reverse": lambda: dict(windows=_r(4, 4, 2), ws=2, h=4, w=4),
    "layers.shifted_window_mask": lambda: dict(h=4, w=4, ws=2, shift=1),
    "layers.relative_position_index": lambda: dict(wh=2, ww=3),
    "layers.relative_position_bias": lambda: dict(table=_r(9, 2), index=layers.relative_position_index(2)),
    "layers.cpe": lambda: dict(x=_r(1, 2, 3, 3), weight=_r(2, 1, 3, 3), bias=_r(2)),
    "layers.cpe_bound": lambda: dict(x=_r(1, 2, 3, 3), weight=_r(2, 1, 3, 3), bias=_r(2), dtype=F32),
    "layers.patch_merging": lambda: dict(x=_r(1, 4, 4, 4), p=_merge_p(), eps=1e-5),
    # --- refimpl.numerics (array functions) ---
    "numerics.softmax": lambda: dict(x=_r(2, 5), axis=-1),
    "numerics.softmax_bound": lambda: dict(x=_r(2, 5), axis=-1),
    "numerics.gelu": lambda: dict(x=_r(2, 5), approximate="tanh"),
    "numerics.elu": lambda: dict(x=_r(2, 5), alpha=1.0),
    "numerics.softplus": lambda: dict(x=_r(2, 5), beta=1.0, threshold=20.0),
    "numerics.relu": lambda: dict(x=_r(2, 5)),
    "numerics.leaky_relu": lambda: dict(x=_r(2, 5), negative_slope=0.01),
    "numerics.l2_normalize": lambda: dict(x=_r(2, 5), axis=-1, eps=1e-12, policy="clamp"),
    "numerics.pow2_exponent": lambda: dict(x=_r(2, 5), axis=-1),
    "numerics.softmax_shifted": lambda: dict(s=_r(2, 5), shift=np.array([[0], [3]]), axis=-1),
    # --- refimpl.toeplitz ---
    "toeplitz.toeplitz": lambda: dict(e=_r(5), ndim=1, max_elements=None),
    "toeplitz.circulant": lambda: dict(w=_r(3), ndim=1, max_elements=None),
    "toeplitz.num_toeplitz_params": lambda: dict(grid=(3, 4)),
    "toeplitz.num_circulant_params": lambda: dict(grid=(3, 4)),
    "toeplitz.toeplitz_grid": lambda: dict(e=_r(5, 2), ndim=1, name="e"),
    "toeplitz.circulant_grid": lambda: dict(w=_r(3, 2), ndim=1, name="w"),
    "toeplitz.periodize": lambda: dict(e=_r(5), ndim=1, lengths=6),
    "toeplitz.embed_circulant": lambda: dict(w=_r(3), ndim=1),
    "toeplitz.restrict_support": lambda: dict(e=_r(5), ndim=1, radius=1),
    "toeplitz.offset_kernel": lambda: dict(e=_r(5), ndim=1),
    "toeplitz.dense_product": lambda: dict(m=_r(3, 3), x=_r(2, 3), ndim=1),
    "toeplitz.circulant_product": lambda: dict(w=_r(3), x=_r(3), ndim=1, method="rfft", taps=None,
                                               max_elements=None),
    "toeplitz.toeplitz_product": lambda: dict(e=_r(5), x=_r(3), ndim=1, method="rfft", lengths=None, taps=None,
                                              max_elements=None),
    "toeplitz.wraparound_matrix": lambda: dict(e=_r(5), ndim=1, max_elements=None),
    "toeplitz.fft_convolution_depth": lambda: dict(lengths=(8, 4)),
    "toeplitz.fft_convolution_bound": lambda: dict(x=_r(3), k=_r(5), ndim=1, lengths=None),
    "toeplitz.dense_product_bound": lambda: dict(m=_r(3, 3), x=_r(2, 3), ndim=1),
    "toeplitz.circulant_product_bound": lambda: dict(w=_r(3), x=_r(3), ndim=1, method="rfft"),
    "toeplitz.toeplitz_product_bound": lambda: dict(e=_r(5), x=_r(3), ndim=1, method="rfft", lengths=None),
    "toeplitz.abs_convolution": lambda: dict(w=_r(5), x=_r(3), ndim=1, toeplitz_params=True, lengths=None),
    "toeplitz.default_lengths": lambda: dict(grid=(3, 4)),
    # --- refimpl.attention.angular ---
    "angular.arcsin_coefficients_exact": lambda: dict(order=4),
    "angular.arcsin_coefficients": lambda: dict(order=4),
    "angular.arcsin_series": lambda: dict(x=_unit(6), order=4),
    "angular.arcsin_series_derivative": lambda: dict(x=_unit(6), order=4),
    "angular.arcsin_series_bound": lambda: dict(x=_unit(6), order=4),
    "angular.arcsin_tail_bound": lambda: dict(x=_unit(6), order=4, kind="geometric"),
    "angular.arcsin_tail_tightness": lambda: dict(x=_unit(6), order=4, kind="geometric"),
    "angular.unit_rows": lambda: dict(x=_r(3, 4), eps=1e-12, policy="clamp", arithmetic="scaled"),
    "angular.cosine_matrix": lambda: dict(q=_r(3, 4), k=_r(5, 4, seed=1), eps=1e-12, policy="clamp",
                                          max_elements=None),
    "angular.spectral_angle": lambda: dict(q=_r(3, 4), k=_r(5, 4, seed=1), method="atan2", eps=1e-12,
                                           policy="clamp", max_elements=None),
    "angular.angular_similarity": lambda: dict(q=_r(3, 4), k=_r(5, 4, seed=1), method="atan2", eps=1e-12,
                                               policy="clamp", max_elements=None),
    "angular.angular_similarity_series": lambda: dict(q=_r(3, 4), k=_r(5, 4, seed=1), order=3, eps=1e-12,
                                                      policy="clamp", max_elements=None),
    "angular.tensor_power": lambda: dict(x=_r(3, 2), p=2),
    "angular.angular_series_features": lambda: dict(x=_r(3, 2), order=2, constant=True, eps=1e-12,
                                                    policy="clamp"),
    "angular.hyperplane_features": lambda: dict(x=_r(3, 4), directions=_r(6, 4, seed=1)),
    "angular.exponential_kernel": lambda: dict(x=_r(3, 4), y=_r(5, 4, seed=1), sigma=1.0),
    "angular.gaussian_rbf_kernel": lambda: dict(x=_r(3, 4), y=_r(5, 4, seed=1), sigma=1.0),
    "angular.angular_attention": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), order=None, normalize=False,
                                              method="atan2", eps=1e-12, policy="clamp", max_elements=None,
                                              taps=None),
    "angular.angular_attention_features": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), order=2, normalize=False,
                                                       eps=1e-12, policy="clamp", taps=None),
    "angular.linear_angular_attention": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), constant="sum", normaliser="none",
                                                     eps=1e-12, policy="clamp", arithmetic="scaled", taps=None),
    "angular.linear_angular_attention_bound": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), constant="sum",
                                                           normaliser="none", eps=1e-12),
    "angular.token_conv": lambda: dict(v=_q3(), weight=_r(2, 1, 3, 1), bias=_r(2)),
    "angular.grid_conv": lambda: dict(v=_q3(), weight=_r(8, 1, 3, 3), bias=_r(8), hw=(3, 3)),
    "angular.masked_softmax_branch": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), threshold=0.02, scale=1.0,
                                                  max_elements=None, taps=None),
    "angular.init_castling_params": lambda: dict(cfg=_ccfg(), rng=0),
    "angular.castling_core": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), cfg=_ccfg(),
                                          conv_weight=_r(2, 1, _ccfg().conv_kernel, 1), conv_bias=None,
                                          training=False, hw=None, taps=None),
    "angular.castling_attention": lambda: dict(x=_r(1, 9, 8), params=angular.init_castling_params(_ccfg(), 0),
                                               cfg=_ccfg(), training=False, hw=None, taps=None),
    "angular.angular_similarity_bound": lambda: dict(q=_r(3, 4), k=_r(5, 4, seed=1), dtype=F32, order=None,
                                                     method="atan2", eps=1e-12, policy="clamp", err_q=None,
                                                     err_k=None),
    "angular.angular_attention_bound": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), dtype=F32, order=None,
                                                    normalize=False, method="atan2", eps=1e-12, policy="clamp"),
    "angular.castling_core_bound": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), cfg=_ccfg(), dtype=F32,
                                                conv_weight=_r(2, 1, _ccfg().conv_kernel, 1), conv_bias=None,
                                                training=False, hw=None, err_q=None, err_k=None, err_v=None),
    "angular.castling_attention_bound": lambda: dict(x=_r(1, 9, 8),
                                                     params=angular.init_castling_params(_ccfg(), 0), cfg=_ccfg(),
                                                     dtype=F32, training=False, hw=None),
    # --- refimpl.attention.enhanced ---
    "enhanced.enhanced_linear_attention": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), c_min=100.0, scale=1.0,
                                                       scale_mode="divide", scale_target="numerator",
                                                       order="linear", taps=None, max_elements=None),
    "enhanced.enhanced_attention": lambda: dict(x=_r(1, 9, 8), params=_rand_params(
        {k[len("attn."):]: s for k, s in enhanced.l2vit_param_shapes(_ecfg(), "lga").items()
         if k.startswith("attn.")}), cfg=_ecfg(), order="linear", taps=None, max_elements=None),
    "enhanced.lcm": lambda: dict(x=_r(1, 9, 8), params=_lcm_params(), hw=(3, 3), batch_norm_eps=1e-5, taps=None),
    "enhanced.lga_block": lambda: dict(x=_r(1, 9, 8), params=enhanced.init_l2vit_params(_ecfg(), "lga"),
                                       cfg=_ecfg(), hw=(3, 3), order="linear", taps=None, max_elements=None),
    "enhanced.lwa_block": lambda: dict(x=_r(1, 16, 8), params=enhanced.init_l2vit_params(_ecfg(), "lwa"),
                                       cfg=_ecfg(), hw=(4, 4), taps=None),
    "enhanced.l2vit_param_shapes": lambda: dict(cfg=_ecfg(), block="lga"),
    "enhanced.init_l2vit_params": lambda: dict(cfg=_ecfg(), block="lwa", seed=0),
    "enhanced.enhanced_linear_attention_bound": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), c_min=100.0, scale=1.0,
                                                             scale_mode="divide", scale_target="numerator",
                                                             dtype=F32, order=None),
    "enhanced.enhanced_attention_bound": lambda: dict(x=_r(1, 9, 8), params=_rand_params(
        {k[len("attn."):]: s for k, s in enhanced.l2vit_param_shapes(_ecfg(), "lga").items()
         if k.startswith("attn.")}), cfg=_ecfg(), dtype=F32, order=None),
    "enhanced.lcm_bound": lambda: dict(x=_r(1, 9, 8), params=_lcm_params(), hw=(3, 3), batch_norm_eps=1e-5),
    "enhanced.lga_block_bound": lambda: dict(x=_r(1, 9, 8), params=enhanced.init_l2vit_params(_ecfg(), "lga"),
                                             cfg=_ecfg(), hw=(3, 3), dtype=F32, order=None),
    "enhanced.lwa_block_bound": lambda: dict(x=_r(1, 16, 8), params=enhanced.init_l2vit_params(_ecfg(), "lwa"),
                                             cfg=_ecfg(), hw=(4, 4), dtype=F32),
    # --- refimpl.attention.focused ---
    "focused.focused_function": lambda: dict(x=_r(3, 4, pos=True), p=3.0, axis=-1, power_scaling="max"),
    "focused.focused_feature_map": lambda: dict(x=_r(3, 4), p=3.0, axis=-1, power_scaling="max"),
    "focused.focused_function_error": lambda: dict(x=_r(3, 4, pos=True), p=3.0, err_x=None, axis=-1, dtype=F32),
    "focused.focused_function_bound": lambda: dict(x=_r(3, 4, pos=True), p=3.0, axis=-1, dtype=F32),
    "focused.focused_attention": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), p=3.0, hw=(3, 3),
                                              dwc_weight=_r(8, 1, 3, 3), dwc_bias=_r(8), order="linear", eps=1e-6,
                                              normaliser="sum", power_scaling="max", taps=None, max_elements=None),
    "focused.focused_linear_attention": lambda: dict(x=_r(1, 9, 8), params=focused.init_focused_params(
        _fcfg(), layout="global", n_kv=9), cfg=_fcfg(), hw=(3, 3), order="linear", taps=None, max_elements=None),
    "focused.focused_window_attention": lambda: dict(x=_r(1, 16, 8), params=focused.init_focused_params(
        _fcfg(), layout="window", n_kv=4), cfg=_fcfg(), hw=(4, 4), window_size=2, shift=1, order="linear",
        taps=None, max_elements=None),
    "focused.resample_linear": lambda: dict(x=_r(2, 5), size=3, axis=-1),
    "focused.resample_linear_bound": lambda: dict(x=_r(2, 5), size=3, axis=-1),
    "focused.focused_param_shapes": lambda: dict(cfg=_fcfg(), layout="global", n_kv=9),
    "focused.init_focused_params": lambda: dict(cfg=_fcfg(), layout="global", n_kv=9, seed=0),
    "focused.focused_attention_bound": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), p=3.0, hw=(3, 3),
                                                    dwc_weight=_r(8, 1, 3, 3), dwc_bias=_r(8), eps=1e-6,
                                                    normaliser="sum", dtype=F32, order=None, power_scaling=None),
    "focused.focused_linear_attention_bound": lambda: dict(x=_r(1, 9, 8), params=focused.init_focused_params(
        _fcfg(), layout="global", n_kv=9), cfg=_fcfg(), hw=(3, 3), dtype=F32, order=None),
    "focused.focused_window_attention_bound": lambda: dict(x=_r(1, 16, 8), params=focused.init_focused_params(
        _fcfg(), layout="window", n_kv=4), cfg=_fcfg(), hw=(4, 4), window_size=2, shift=1, dtype=F32, order=None),
    # --- refimpl.attention.linear ---
    "linear.feature_map": lambda: dict(x=_r(3, 4), name="elu1"),
    "linear.feature_map_error": lambda: dict(x=_r(3, 4), name="elu1"),
    "linear.apply_normaliser": lambda: dict(den=_r(5, pos=True), eps=1e-6, eps_policy="add", clamp_min=None),
    "linear.kernelized_attention": lambda: dict(phi_q=np.abs(_q3()), phi_k=np.abs(_q3(1)), v=_q3(2),
                                                order="linear", normalize=True, eps=1e-6, eps_policy="add",
                                                clamp_min=None, taps=None, max_elements=None),
    "linear.linear_attention": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), feature_map="elu1", order="linear",
                                            normalize=True, eps=1e-6, eps_policy="add", clamp_min=None, taps=None,
                                            max_elements=None, feature_map_options=None),
    "linear.kernelized_attention_bound": lambda: dict(phi_q=np.abs(_q3()), phi_k=np.abs(_q3(1)), v=_q3(2),
                                                      err_q=None, err_k=None, normalize=True, eps=1e-6,
                                                      eps_policy="add", clamp_min=None, dtype=F32),
    "linear.linear_attention_bound": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), feature_map="elu1", normalize=True,
                                                  eps=1e-6, eps_policy="add", clamp_min=None, dtype=F32,
                                                  feature_map_options=None, order=None),
    # --- refimpl.attention.lisa ---
    "lisa.lisa_param_shapes": lambda: dict(cfg=_lcfg()),
    "lisa.sa_param_shapes": lambda: dict(cfg=_scfg()),
    "lisa.lisa_block_param_shapes": lambda: dict(cfg=_lcfg()),
    "lisa.init_params": lambda: dict(shapes={"a": (2, 3)}, seed=0, std=0.02),
    "lisa.lisa_core": lambda: dict(**_lisa_core(), exact_toeplitz=False, fft_lengths=None, transform="rfft",
                                   eps=1e-12, taps=None),
    "lisa.sa_eq4": lambda: dict(q=_r(1, 2, 9, 4), k=_r(1, 2, 9, 4, seed=1), v=_r(1, 2, 9, 4, seed=2),
                                rpe=_r(9, 9, seed=3), eps=1e-12, taps=None, max_elements=None),
    "lisa.sa_eq5": lambda: dict(q=_r(1, 2, 9, 4), k=_r(1, 2, 9, 4, seed=1), v=_r(1, 2, 9, 4, seed=2),
                                ra=_r(9, 9, 2, seed=3), rb=_r(9, 9, 2, seed=4), bias_b=_r(4, 2, seed=6), eps=1e-12,
                                taps=None, max_elements=None),
    "lisa.sa_eq6": lambda: dict(q=_r(1, 2, 9, 4), k=_r(1, 2, 9, 4, seed=1), v=_r(1, 2, 9, 4, seed=2),
                                ra_tilde=_r(9, 9, 4, 2, seed=3), rb=_r(9, 9, 2, seed=4), bias_b=_r(4, 2, seed=6),
                                eps=1e-12, taps=None, max_elements=None),
    "lisa.sa_eq7": lambda: dict(**_sa_terms(), eps=1e-12, taps=None, max_elements=None),
    "lisa.sa_eq8_terms": lambda: dict(**_sa_terms(), eps=1e-12, max_elements=None),
    "lisa.rpe_matrix": lambda: dict(params=_r(25, 2), grid=(3, 3), rpe="toeplitz", max_elements=None),
    "lisa.lisa_attention": lambda: dict(x=_r(1, 9, 8), params=lisa.init_params(lisa.lisa_param_shapes(_lcfg())),
                                        cfg=_lcfg(), taps=None),
    "lisa.structure_aware_attention": lambda: dict(x=_r(1, 9, 8), params=lisa.init_params(
        lisa.sa_param_shapes(_scfg())), cfg=_scfg(), taps=None),
    "lisa.lisa_block": lambda: dict(x=_r(1, 9, 8), params=lisa.init_params(lisa.lisa_block_param_shapes(_lcfg())),
                                    cfg=_lcfg(), taps=None),
    "lisa.resample_circular_kernel": lambda: dict(w=_r(9, 2), old_grid=(3, 3), new_grid=(4, 4)),
    "lisa.resample_toeplitz_kernel": lambda: dict(e=_r(25, 2), old_grid=(3, 3), new_grid=(4, 4)),
    "lisa.resize_lisa_params": lambda: dict(params=lisa.init_params(lisa.lisa_param_shapes(_lcfg())), cfg=_lcfg(),
                                            new_grid=(4, 4)),
    "lisa.lisanet_isotropic_param_count": lambda: dict(img_size=32, patch_size=16, in_chans=3, dim=8, depth=2,
                                                       num_heads=2, latent=4, mlp_ratio=4.0, num_classes=10),
    "lisa.lisa_core_bound": lambda: dict(**_lisa_core(), exact_toeplitz=False, fft_lengths=None, eps=1e-12,
                                         dtype=F32),
    "lisa.sa_core_bound": lambda: dict(q=_r(1, 2, 9, 4), k=_r(1, 2, 9, 4, seed=1), v=_r(1, 2, 9, 4, seed=2),
                                       form="eq4", rpe=_r(9, 9, seed=3), eps=1e-12, dtype=F32),
    "lisa.lisa_attention_bound": lambda: dict(x=_r(1, 9, 8), params=lisa.init_params(
        lisa.lisa_param_shapes(_lcfg())), cfg=_lcfg(), dtype=F32),
    "lisa.structure_aware_attention_bound": lambda: dict(x=_r(1, 9, 8), params=lisa.init_params(
        lisa.sa_param_shapes(_scfg())), cfg=_scfg(), dtype=F32),
    "lisa.lisa_block_bound": lambda: dict(x=_r(1, 9, 8), params=lisa.init_params(
        lisa.lisa_block_param_shapes(_lcfg())), cfg=_lcfg(), dtype=F32),
    # --- refimpl.attention.rala ---
    "rala.kappa": lambda: dict(x=_r(3, 4), kernel="elu1"),
    "rala.rope_2d_angles": lambda: dict(h=3, w=3, head_dim=4, base=10000.0),
    "rala.apply_rope_2d": lambda: dict(x=_r(1, 2, 9, 4), angles=rala.rope_2d_angles(3, 3, 4)),
    "rala.reweighting_coefficients": lambda: dict(q_global=_r(1, 2, 1, 4), kappa_k=_r(1, 2, 9, 4, pos=True),
                                                  scale=0.5),
    "rala.kv_buffer": lambda: dict(alpha=_r(1, 2, 9, pos=True), kappa_k=_r(1, 2, 9, 4, pos=True),
                                   v=_r(1, 2, 9, 4, seed=2)),
    "rala.rala_core": lambda: dict(q=_r(1, 2, 9, 4), k=_r(1, 2, 9, 4, seed=1), v=_r(1, 2, 9, 4, seed=2),
                                   cfg=_rcfg(), hw=(3, 3), taps=None, max_elements=None),
    "rala.rala_attention": lambda: dict(x=_r(1, 3, 3, 8), params=_rand_params(rala.rala_param_shapes(_rcfg())),
                                        cfg=_rcfg(), taps=None, max_elements=None),
    "rala.ravlt_ffn": lambda: dict(x=_r(1, 3, 3, 8), params=_bn_params(
        {k[len("ffn."):]: s for k, s in rala.ravlt_block_param_shapes(_bcfg()).items() if k.startswith("ffn.")}),
        cfg=_bcfg(), taps=None),
    "rala.ravlt_block": lambda: dict(x=_r(1, 3, 3, 8), params=_bn_params(rala.ravlt_block_param_shapes(_bcfg())),
                                     cfg=_bcfg(), taps=None, max_elements=None),
    "rala.rala_param_shapes": lambda: dict(cfg=_rcfg()),
    "rala.ravlt_block_param_shapes": lambda: dict(cfg=_bcfg()),
    "rala.rala_core_bound": lambda: dict(q=_r(1, 2, 9, 4), k=_r(1, 2, 9, 4, seed=1), v=_r(1, 2, 9, 4, seed=2),
                                         cfg=_rcfg(), hw=(3, 3), dtype=F32),
    "rala.rala_attention_bound": lambda: dict(x=_r(1, 3, 3, 8), params=_rand_params(
        rala.rala_param_shapes(_rcfg())), cfg=_rcfg(), dtype=F32),
    "rala.ravlt_ffn_bound": lambda: dict(x=_r(1, 3, 3, 8), params=_bn_params(
        {k[len("ffn."):]: s for k, s in rala.ravlt_block_param_shapes(_bcfg()).items() if k.startswith("ffn.")}),
        cfg=_bcfg(), dtype=F32),
    "rala.residual_bound": lambda: dict(a=_r(2, 3), b=_r(2, 3, seed=1), gamma=_r(3), dtype=F32),
    "rala.ravlt_cpe": lambda: dict(x=_r(1, 3, 3, 8), params=_rand_params(
        {k: s for k, s in rala.ravlt_block_param_shapes(_bcfg()).items() if k.startswith("pos.")}),
        cfg=_bcfg()),
    # --- refimpl.attention.softmax ---
    "softmax.softmax_attention": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), scale=0.5, bias=_r(2, 9, 9),
                                              mask=None, taps=None, max_elements=None),
    "softmax.softmax_attention_error": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), scale=0.5, bias=_r(2, 9, 9),
                                                    mask=None, err_q=None, err_k=None, err_v=None, dtype=F32),
    "softmax.softmax_attention_bound": lambda: dict(q=_q3(), k=_q3(1), v=_q3(2), scale=0.5, bias=_r(2, 9, 9),
                                                    mask=None, dtype=F32),
    "softmax.window_attention": lambda: dict(x=_r(1, 4, 4, 4), p=_window_p(), num_heads=2, window_size=2,
                                             shift=1, pad=True, rel_pos_bias=True, mask_padding=True,
                                             mask_value=None, scale=None, taps=None),
    "softmax.window_attention_bound": lambda: dict(x=_r(1, 4, 4, 4), p=_window_p(), num_heads=2, window_size=2,
                                                   shift=1, pad=True, rel_pos_bias=True, mask_padding=True,
                                                   mask_value=None, scale=None, dtype=F32),
}

MODULES = {"layers": layers, "numerics": numerics, "toeplitz": toeplitz, "angular": angular,
           "enhanced": enhanced, "focused": focused, "linear": linear, "lisa": lisa, "rala": rala,
           "softmax": softmax}
