"""A network checks its parameters once per call (docs/benchmarks.md, "Profiles" item 3).

The public entry of a network (forward / run / features / run_unit ...) runs the strict check
(``validation.check_params`` against the family's ``param_shapes``) once and passes the checked mapping, a
:class:`refimpl.validation.CheckedParams`, down; ``layers.subparams`` cuts checked sub-mappings from an index and
the attention and MLP functions accept them without checking again.  These tests pin:

1. the count: one full check per forward and per directly called ``run_unit``, for every registered network
   (reduced config), and each level of the checked sub-mapping tree made once per forward;
2. strictness: the same functions called directly (a network's forward, run, features, run_unit; ``layers.mlp``,
   an attention function) still refuse a misspelled, an extra, a missing and a misshapen key by its full name;
   a ``CheckedParams`` asked about another table gets the full check with the plain mapping's message; a
   snapshot does not follow later changes to the dict it was taken from, and that dict is checked in full again;
3. bit-identity: every network's logits and feature maps are the same bits with and without the fast path.
"""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

import refimpl.models as rm
from refimpl import layers, validation
from refimpl.attention.focused import FocusedConfig, focused_linear_attention, focused_param_shapes
from refimpl.errors import ParameterKeyError, ParameterShapeError
from refimpl.models import common

#: Full checks a forward makes besides the network's own, with why: a mapping that a function inside the forward
#: builds itself (a plain dict, so it is checked in full, a few keys each).
INNER_PLAIN_CHECKS = {
    # rala.ravlt_cpe filters the block's "pos." entries into a new dict (refimpl/attention/rala.py).
    "ravlt_cpe (the 'pos.' entries of argument 'params')",
}


def _small(name):
    mod = rm.family_of(name)
    cfg = mod.reduced(rm.create(name)[0])
    hw = getattr(cfg, "img_size", None) or getattr(cfg, "image_size", None) or (15, 13)
    images = np.random.default_rng(1).standard_normal((1, cfg.in_chans) + tuple(hw))
    return mod, cfg, mod.init_params(cfg, np.random.default_rng(0)), images


class _Counter:
    """Counts the full checks (``validation._check_params_full``) by ``where`` and table size, and the entries
    scanned to make checked sub-mappings (``validation._split_first``)."""

    def __init__(self, monkeypatch):
        self.full: collections.Counter = collections.Counter()
        self.scanned = 0
        full, split = validation._check_params_full, validation._split_first

        def counted_full(params, expected, where):
            self.full[(where, len(expected))] += 1
            return full(params, expected, where)

        def counted_split(data, shapes):
            self.scanned += len(data)
            return split(data, shapes)

        monkeypatch.setattr(validation, "_check_params_full", counted_full)
        monkeypatch.setattr(validation, "_split_first", counted_split)

    def reset(self):
        self.full.clear()
        self.scanned = 0

    def network_checks(self, n_keys):
        """(full checks of a table of n_keys entries made by a network entry, any other full checks)."""
        own = sum(c for (where, n), c in self.full.items() if where.endswith(" network") and n == n_keys)
        other = {where for (where, n), c in self.full.items()
                 if not (where.endswith(" network") and n == n_keys)}
        return own, other


# ===================================================================================================
# 1. The count
# ===================================================================================================

@pytest.mark.parametrize("name", rm.names())
def test_one_full_check_per_forward_and_per_unit(name, monkeypatch):
    mod, cfg, params, images = _small(name)
    n_keys = len(mod.param_shapes(cfg))
    counter = _Counter(monkeypatch)
    mod.forward(params, images, cfg)
    own, other = counter.network_checks(n_keys)
    assert own == 1, f"{name}: {own} full checks of the network's parameters in one forward ({dict(counter.full)})"
    assert other <= INNER_PLAIN_CHECKS, f"{name}: sub-mappings checked again in full: {other - INNER_PLAIN_CHECKS}"
    # each level of the sub-mapping tree is made once: an entry is scanned at most once per dot in its key (a
    # pass over the whole mapping per layers.subparams call would scan it once per call)
    bound = sum(k.count(".") for k in params)
    assert counter.scanned <= bound, f"{name}: {counter.scanned} entries scanned for sub-mappings (> {bound})"

    # run_unit called directly: each call checks the whole mapping once (its own public entry)
    x = images
    for unit in mod.unit_names(cfg):
        counter.reset()
        x = mod.run_unit(params, unit, x, cfg)
        own, other = counter.network_checks(n_keys)
        assert own == 1, f"{name}: unit {unit}: {own} full checks ({dict(counter.full)})"
        assert other <= INNER_PLAIN_CHECKS, f"{name}: unit {unit}: {other - INNER_PLAIN_CHECKS}"


def test_check_params_answers_a_matching_checked_mapping_at_once(monkeypatch):
    mod, cfg, params, _ = _small("flatten_deit_t")
    counter = _Counter(monkeypatch)
    checked = mod._check_params(params, cfg)
    assert isinstance(checked, validation.CheckedParams) and counter.full.total() == 1
    assert mod._check_params(checked, cfg) is checked
    assert validation.check_params(checked, dict(mod.param_shapes(cfg)), where="t") is checked   # equal table
    assert counter.full.total() == 1


# ===================================================================================================
# 2. Strictness kept
# ===================================================================================================

def _corruptions(params):
    """(label, corrupted mapping, exception class, message pattern naming the full key)."""
    keys = sorted(params)
    bias = [k for k in keys if k.endswith(".bias") and k.count(".") >= 2][0]
    typo = bias[:-len("bias")] + "bais"
    gone = keys[len(keys) // 2]
    wrong = [k for k in keys if np.ndim(params[k]) == 2][-1]
    shape = params[wrong].shape
    return [
        ("misspelled", {(typo if k == bias else k): v for k, v in params.items()}, ParameterKeyError,
         rf"unexpected '{re.escape(typo)}' \(did you mean '{re.escape(bias)}'\?\); missing '{re.escape(bias)}'"),
        ("extra", {**params, "blocks.99.attn.extra.weight": np.zeros(3)}, ParameterKeyError,
         r"unexpected 'blocks\.99\.attn\.extra\.weight'"),
        ("missing", {k: v for k, v in params.items() if k != gone}, ParameterKeyError,
         rf"missing '{re.escape(gone)}'"),
        ("shape", {**params, wrong: np.zeros((shape[0] + 1,) + shape[1:])}, ParameterShapeError,
         rf"parameter '{re.escape(wrong)}': expected shape \({shape[0]}, {shape[1]}\), got \({shape[0] + 1}, "
         rf"{shape[1]}\)"),
    ]


@pytest.mark.parametrize("name", rm.names())
def test_every_public_network_entry_still_checks_in_full(name):
    """run, features and run_unit (stem and the first unit after it, fed a correct input) refuse each
    corruption with the full key, like forward (tests/test_bad_input.py)."""
    mod, cfg, params, images = _small(name)
    units = mod.unit_names(cfg)
    x1 = mod.run_unit(params, units[0], images, cfg)
    for label, bad, exc, pattern in _corruptions(params):
        for call in (lambda p: mod.run(p, images, cfg), lambda p: mod.features(p, images, cfg),
                     lambda p: mod.run_unit(p, units[0], images, cfg), lambda p: mod.run_unit(p, units[1], x1, cfg)):
            with pytest.raises(exc, match=pattern):
                call(bad)
        # a corrupted mapping is refused also right after the same network ran on the good one
        mod.run_unit(params, units[1], x1, cfg)
        with pytest.raises(exc, match=pattern):
            mod.run_unit(bad, units[1], x1, cfg)


def _mlp_params(rng, c=6, hidden=10):
    return {"fc1.weight": rng.standard_normal((hidden, c)), "fc1.bias": rng.standard_normal(hidden),
            "fc2.weight": rng.standard_normal((c, hidden)), "fc2.bias": rng.standard_normal(c)}


def _message(fn):
    with pytest.raises(Exception) as e:
        fn()
    return type(e.value), str(e.value)


def test_layer_and_attention_functions_check_plain_mappings_in_full():
    rng = np.random.default_rng(3)
    good = _mlp_params(rng)
    x = rng.standard_normal((2, 5, 6))
    cases = [({**good, "fc1.bais": good["fc1.bias"]}, ParameterKeyError, r"unexpected 'fc1\.bais'"),
             ({k: v for k, v in good.items() if k != "fc2.weight"}, ParameterKeyError, r"'fc2\.weight'"),
             ({**good, "fc2.bias": np.zeros(7)}, ParameterShapeError, r"parameter 'fc2\.bias': expected shape \(6,\)")]
    for bad, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            layers.mlp(x, bad)
    fcfg = FocusedConfig.preset("official", dim=8, num_heads=2)
    shapes = focused_param_shapes(fcfg, layout="global", n_kv=12)
    ap = {k: rng.standard_normal(s) for k, s in shapes.items()}
    key = sorted(ap)[0]
    typo = key + "x"
    with pytest.raises(ParameterKeyError, match=rf"unexpected '{re.escape(typo)}' \(did you mean '{re.escape(key)}'"):
        focused_linear_attention(rng.standard_normal((1, 12, 8)), {(typo if k == key else k): v for k, v in ap.items()},
                                 fcfg, (3, 4))


def test_checked_mapping_against_another_table_gets_the_full_check_and_its_message():
    rng = np.random.default_rng(4)
    good = _mlp_params(rng)
    expected = {k: v.shape for k, v in good.items()}
    checked = validation.checked_params(good, expected, where="t")
    others = [{k: s for k, s in expected.items() if k != "fc1.bias"},                # an entry not expected
              {**expected, "fc1.bias": (11,)},                                       # another shape
              {**expected, "fc3.weight": (2, 2)}]                                    # a missing entry
    for other in others:
        plain = _message(lambda: validation.check_params(dict(good), other, where="w"))
        assert _message(lambda: validation.check_params(checked, other, where="w")) == plain
    # a layer given a checked mapping for another input size: the same refusal as with the plain mapping
    x7 = rng.standard_normal((2, 5, 7))
    assert _message(lambda: layers.mlp(x7, checked)) == _message(lambda: layers.mlp(x7, dict(good)))
    # the table's bare BatchNorm counter: refused in a sub-mapping exactly as in the plain one (no fast path)
    bn = {"bn.weight": np.ones(3), "bn.bias": np.zeros(3), "bn.running_mean": np.zeros(3),
          "bn.running_var": np.ones(3), "bn.num_batches_tracked": np.array(5)}
    checked_bn = validation.checked_params(bn, {k: (3,) for k in bn if not k.endswith("tracked")}, where="t")
    sub_expected = {"weight": (3,), "bias": (3,), "running_mean": (3,), "running_var": (3,)}
    plain = _message(lambda: validation.check_params(layers.subparams(bn, "bn"), sub_expected, where="w"))
    assert plain[0] is ParameterKeyError and "num_batches_tracked" in plain[1]
    assert _message(lambda: validation.check_params(layers.subparams(checked_bn, "bn"), sub_expected,
                                                    where="w")) == plain
    assert validation.check_params(checked, expected, where="w") is checked
    with pytest.raises(AttributeError):          # no table: the full check's own failure, not a pass
        validation.check_params(layers.subparams(checked, "fc1"), None, where="w")


def test_snapshot_does_not_follow_the_dict_and_the_dict_is_checked_again():
    """Decision: a CheckedParams is an immutable snapshot.  Changing the dict it was taken from changes
    nothing in it, and that dict passed again is checked in full (the change is refused)."""
    mod, cfg, params, images = _small("flatten_deit_t")
    reference = mod.forward(params, images, cfg)
    source = dict(params)
    checked = mod._check_params(source, cfg)
    key = sorted(source)[3]
    source[key + "x"] = source.pop(key)                                  # misspell a key after the check
    source["head.bias"] = np.zeros(3)                                    # and reshape another
    with pytest.raises(ParameterShapeError, match=r"parameter 'head\.bias'"):
        mod.forward(source, images, cfg)
    assert key in checked and key + "x" not in checked and len(checked) == len(params)
    np.testing.assert_array_equal(mod.forward(checked, images, cfg), reference)
    with pytest.raises(TypeError):
        checked[key] = np.zeros(1)                                       # immutable
    with pytest.raises(TypeError):
        validation.CheckedParams({})                                     # made only by checked_params
    source["head.bias"] = params["head.bias"]
    with pytest.raises(ParameterKeyError, match=rf"unexpected '{re.escape(key)}x'"):
        validation.checked_params(source, checked.shapes, where="t")


def test_checked_sub_mappings_equal_the_filtered_ones():
    mod, cfg, params, _ = _small("l2vit_tiny")
    checked = mod._check_params(params, cfg)
    prefixes = sorted({k.rsplit(".", i)[0] for k in params for i in range(1, k.count(".") + 1)})
    for prefix in prefixes + [""]:
        sub, plain = layers.subparams(checked, prefix), layers.subparams(params, prefix)
        assert isinstance(sub, validation.CheckedParams)
        assert list(sub) == list(plain) and all(sub[k] is plain[k] for k in plain)
        assert layers.subparams(checked, prefix) is sub                 # one view per prefix
    assert _message(lambda: layers.subparams(checked, "stages.9")) == _message(
        lambda: layers.subparams(params, "stages.9"))
    assert list(layers.subparams(layers.subparams(checked, "stages.0"), "1.attn")) == list(
        layers.subparams(params, "stages.0.1.attn"))


# ===================================================================================================
# 3. Bit-identity with and without the fast path
# ===================================================================================================

@pytest.mark.parametrize("name", rm.names())
def test_outputs_bit_identical_without_the_fast_path(name, monkeypatch):
    mod, cfg, params, images = _small(name)
    logits, feats = mod.run(params, images, cfg)
    with monkeypatch.context() as m:                  # the entries return the plain mapping: every check in full
        m.setattr(validation, "checked_params",
                  lambda p, expected, *, where: validation.check_params(p, expected, where=where))
        assert not isinstance(common.check_network_params(params, cfg, mod.param_shapes, "x"),
                              validation.CheckedParams)
        slow_logits, slow_feats = mod.run(params, images, cfg)
    np.testing.assert_array_equal(logits, slow_logits)
    assert len(feats) == len(slow_feats)
    for a, b in zip(feats, slow_feats):
        np.testing.assert_array_equal(a, b)
