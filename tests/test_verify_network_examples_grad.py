"""``--grad`` with ``--examples`` for a registered network (:func:`refimpl.verify.network_examples
.verify_network_examples` with ``grad=True``): each drawn example (image size, batch, seed) is verified with the
network's gradients (:mod:`refimpl.verify.network_gradients`: the whole network's input and parameter gradients and
every unit's backward, teacher-forced, against the float64 twin), and the report is the shrunk failing example's,
or the one closest to its bound, the gradients' err/bound included.

The foreign network is the package's twin of LiSANet-I-T (reduced, built for each drawn size by its ``img_size``
keyword) with a backward-only bug (a custom ``autograd.Function``: the forward exact) in one block that is active at
every size but the reduced configuration's own: a single ``--grad`` run at that size matches, the drawn examples
find the bug in the gradients while every forward stage matches.
"""

from __future__ import annotations

import pytest
import torch

from refimpl import verify as V
from refimpl.verify.network_examples import verify_network_examples
from refimpl.verify.networks import network_config, size_field

NAME = "lisanet_i_t"
BLOCK = "stages.0.1"


class _ScaledBackward(torch.autograd.Function):
    """Identity forward; the gradient times 1.1 in the backward (a fused kernel's wrong factor)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return 1.1 * g


def net(img_size=None, bug: bool = False):
    """The reduced twin of LiSANet-I-T built for ``img_size``; with ``bug`` the block's output carries its gradient
    times 1.1 at every size but the reduced configuration's own."""
    import refimpl.twins.models as em
    base = network_config(NAME, None, {"reduced": True}, None)[0]
    cfg = network_config(NAME, None, {"reduced": True}, None if img_size is None else tuple(img_size))[0]
    m = em.build(cfg)
    if bug and tuple(getattr(cfg, size_field(cfg))) != tuple(getattr(base, size_field(base))):
        dict(m.named_modules())[BLOCK].register_forward_hook(lambda _m, _i, out: _ScaledBackward.apply(out))
    return m


KW = dict(config={"reduced": True}, dtype="float64", grad=True, max_side=16)


def test_examples_with_network_gradients_match_and_show_the_closest():
    r = V.verify_examples(net, NAME, 2, **KW)          # the public entry point (the CLI's --examples --grad)
    assert r.verdict == "match" and r.gradients["verdict"] == "match", str(r)
    assert "all 2 example(s) match" in r.findings[-1]["message"], r.findings
    assert r.gradients["twin_forward"]["verdict"] == "match" and r.gradients["units"]
    assert all(t["verdict"] == "match" for t in r.gradients["tensors"])


def test_a_backward_bug_at_the_drawn_sizes_diverges_in_the_gradients():
    assert V.verify(net(bug=True), NAME, config={"reduced": True}, dtype="float64", grad=True).verdict == "match"
    r = verify_network_examples(lambda img_size=None: net(img_size, bug=True), NAME, 2, **KW)
    assert r.verdict == "diverges" and r.gradients["verdict"] == "diverges", str(r)
    assert all(s.verdict == "match" for s in r.stages) and r.first_divergence is None, str(r)
    assert "smallest failing example of 2: image" in r.findings[-1]["message"], r.findings
    assert tuple(r.network["image_hw"]) != tuple(network_config(NAME, None, {"reduced": True}, None)[0].image_size)
    assert r.gradients["first_divergence"]["tensor"] == "input"
    assert r.gradients["units_first_divergence"]["unit"] == BLOCK


def test_grad_must_be_a_bool():
    with pytest.raises(V.VerifyError, match=r"argument 'grad': expected True or False, got 'yes'"):
        verify_network_examples(net, NAME, 2, config={"reduced": True}, grad="yes")
