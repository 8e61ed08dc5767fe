"""benchmarks/profile_networks.py: the classification of profiled time into categories (pure logic, no timing)."""

from __future__ import annotations

import pytest

from benchmarks import profile_networks as pn


@pytest.mark.parametrize("key, cat", [
    ("refimpl/layers.py:linear", "matmul/BLAS"),
    ("refimpl/numerics.py:gelu", "elementwise"),
    ("refimpl/layers.py:layer_norm", "elementwise"),
    ("refimpl/layers.py:window_partition", "layout copies"),
    ("<method 'reshape' of 'numpy.ndarray' objects>", "layout copies"),
    ("{method 'copy' of 'numpy.ndarray' objects}", "layout copies"),
    ("refimpl/layers.py:conv2d", "convolution"),
    ("<built-in method refimpl._native._kernels.refimpl_dwconv2d_f64>", "convolution"),
    ("refimpl/backends/_numba.py:depthwise_conv2d", "convolution"),
    ("<built-in method refimpl._native._kernels.refimpl_rala_alpha_f64>", "attention core"),
    ("refimpl/backends/_numba.py:lisa_fft_core", "attention core"),
    ("numpy/fft/_pocketfft.py:rfftn", "FFT"),
    ("refimpl/attention/rala.py:rala_core", "attention core"),
    ("refimpl/models/ravlt.py:ravlt_net_block", "network glue"),
    ("refimpl/models/ravlt.py:_to_layout", "layout copies"),
    ("refimpl/validation.py:check_params", "Python overhead"),
    ("refimpl/backends/_c.py:rala_alpha", "Python overhead"),
    ("<built-in method builtins.isinstance>", "Python overhead"),
    ("<method 'reduce' of 'numpy.ufunc' objects>", None),          # inherits its callers' category
    ("numpy/_core/einsumfunc.py:einsum", None),
    ("somewhere/else.py:f", "other"),
])
def test_classify_ref(key, cat):
    assert pn.classify_ref(key) == cat


def test_ref_key_relative_paths_and_builtins():
    assert pn.ref_key(("/x/lib/python3.11/site-packages/numpy/_core/einsumfunc.py", 1, "einsum")) == \
        "numpy/_core/einsumfunc.py:einsum"
    assert pn.ref_key(("/work/main/refimpl/layers.py", 64, "linear")) == "refimpl/layers.py:linear"
    assert pn.ref_key(("~", 0, "<built-in method builtins.len>")) == "<built-in method builtins.len>"


def test_helpers_split_among_callers_by_their_time():
    """An einsum's own time goes 3:1 to conv2d (convolution) and rala_core (attention) as its callers spent
    3 and 1 seconds in it; a helper only called by a helper goes up the chain; one with no caller to "other"."""
    conv = ("/r/refimpl/layers.py", 1, "conv2d")
    att = ("/r/refimpl/attention/rala.py", 1, "rala_core")
    ein = ("/s/site-packages/numpy/_core/einsumfunc.py", 1, "einsum")
    cein = ("~", 0, "<built-in method numpy._core._multiarray_umath.c_einsum>")
    red = ("~", 0, "<method 'reduce' of 'numpy.ufunc' objects>")
    stats = {
        conv: (1, 1, 2.0, 9.0, {}),
        att: (1, 1, 1.0, 3.0, {}),
        ein: (2, 2, 4.0, 8.0, {conv: (1, 1, 3.0, 6.0), att: (1, 1, 1.0, 2.0)}),
        cein: (2, 2, 4.0, 4.0, {ein: (2, 2, 4.0, 4.0)}),
        red: (1, 1, 0.5, 0.5, {}),
    }
    cats = pn.ref_categories(stats)        # dyadic times (3:1 splits of powers of two): every share and sum is exact
    assert cats["convolution"] == 2.0 + 0.75 * 8.0
    assert cats["attention core"] == 1.0 + 0.25 * 8.0
    assert cats["other"] == 0.5
    assert sum(cats.values()) == sum(v[2] for v in stats.values())


def test_classify_torch_layout_and_fft_first_then_module_then_name():
    assert pn.classify_torch("aten::copy_", "attention core") == "layout copies"
    assert pn.classify_torch("aten::_fft_r2c", None) == "FFT"
    assert pn.classify_torch("aten::bmm", "attention core") == "attention core"
    assert pn.classify_torch("aten::addmm", "matmul/BLAS") == "matmul/BLAS"
    assert pn.classify_torch("aten::bmm", None) == "matmul/BLAS"
    assert pn.classify_torch("aten::_slow_conv2d_forward", None) == "convolution"
    assert pn.classify_torch("aten::gelu", None) == "elementwise"
    assert pn.classify_torch("aten::native_layer_norm", None) == "elementwise"
    assert pn.classify_torch("aten::something_new", None) == "other"


def test_unit_group():
    assert pn.unit_group("layers.1.blocks.3") == "layers.1.blocks.*"
    assert pn.unit_group("blocks.11") == "blocks.*"
    assert pn.unit_group("stem") == "stem"
    assert pn.unit_group("layers.0.downsample") == "layers.0.downsample"
