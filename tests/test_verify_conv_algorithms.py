"""The verify tool's convolution coverage (refimpl.verify.verify's ``conv_algorithms``; refimpl.bounds
.covering_conv_algorithms): a port whose convolutions PyTorch evaluates through NNPACK (CPU, oneDNN off,
batch >= 16: Winograd for 3 x 3 kernels, FFT tiles otherwise) is judged with bounds that cover those
algorithms, and says so; the choice can be given, and a bad one is refused by name."""

from __future__ import annotations

import pytest
import torch

from refimpl import bounds, cli, ensemble
from refimpl import verify as V
from tests.verify_gallery.flatten_port import PortFocusedAttention


def _port(kernel=3, bug=None):
    return PortFocusedAttention(16, 2, sr_ratio=1, n_kv=64, kernel=kernel, bug=bug)


def _covering_note(r):
    return [f for f in r.findings if "convolution bounds cover" in f["message"]]


def test_default_run_covers_direct_convolution_only():
    r = V.verify(_port(), "flatten.attention", hw=(8, 8), batch=2, dtype="float32")
    assert r.verdict == "match", str(r)
    assert not _covering_note(r) and bounds.conv_algorithms() == ("direct",)


@pytest.mark.skipif(not ensemble.nnpack_available(),
                    reason="this PyTorch build has no NNPACK")
@pytest.mark.parametrize("kernel", [3, 5])
def test_oneDNN_off_covers_nnpack_and_a_planted_bug_still_diverges(kernel):
    """batch 16 with oneDNN off: NNPACK evaluates the DWC; the automatic coverage names Winograd and FFT, the
    port matches, and a planted bug in the attention (not in the convolution) still diverges.  With the direct
    bound alone, the correct port's 3 x 3 DWC (NNPACK's Winograd) is judged divergent: 67 x outside it."""
    with torch.backends.mkldnn.flags(enabled=False):
        if kernel == 3:
            r0 = V.verify(_port(kernel), "flatten.attention", hw=(8, 8), batch=16, dtype="float32",
                          conv_algorithms=())
            assert r0.verdict == "diverges" and r0.first_divergence["stage"] == "dwc", str(r0)
        r = V.verify(_port(kernel), "flatten.attention", hw=(8, 8), batch=16, dtype="float32")
        assert r.verdict == "match", str(r)
        assert _covering_note(r) and "winograd and fft" in _covering_note(r)[0]["message"]
        rb = V.verify(_port(kernel, bug="power"), "flatten.attention", hw=(8, 8), batch=16, dtype="float32")
    assert rb.verdict == "diverges", str(rb)
    assert bounds.conv_algorithms() == ("direct",)


def test_given_algorithms_and_bad_ones():
    r = V.verify(_port(), "flatten.attention", hw=(8, 8), batch=2, dtype="float32", conv_algorithms=("winograd",))
    assert r.verdict == "match" and "winograd besides direct evaluation (given)" in _covering_note(r)[0]["message"]
    for bad in ("winograd", ("bogus",)):
        with pytest.raises(V.VerifyError, match="argument 'conv_algorithms'"):
            V.verify(_port(), "flatten.attention", hw=(8, 8), conv_algorithms=bad)


def test_cli_option(tmp_path, capsys):
    gallery = "tests/verify_gallery/flatten_port.py:PortFocusedAttention"
    args = ["verify", gallery, "--reference", "flatten.attention", "--hw", "8,8", "--init",
            '{"dim": 16, "heads": 2, "n_kv": 64, "kernel": 3}', "--json", "-"]
    assert cli.main(args + ["--conv-algorithms", "winograd,fft"]) == 0
    assert "convolution bounds cover winograd and fft" in capsys.readouterr().out
    assert cli.main(args + ["--conv-algorithms", "direct"]) == 0
    assert "convolution bounds cover" not in capsys.readouterr().out
