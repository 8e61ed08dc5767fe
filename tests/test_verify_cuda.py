"""The verify tool on CUDA: the settings of torch's CUDA backends that change the arithmetic the bounds assume are
reported as findings (checked on any machine with the settings toggled), and a port verified with
``device="cuda"`` (skipped without a GPU) matches as on the CPU."""

from __future__ import annotations

import types

import pytest
import torch

from refimpl import verify as V
from refimpl.verify.steps import _precision_findings
from tests.verify_gallery.flatten_port import PortFocusedAttention


def _run_on_cuda(dtype):
    out = types.SimpleNamespace(dtype=dtype, is_cuda=True)
    return types.SimpleNamespace(out=out, other_dtypes={})


@pytest.fixture
def cuda_flags():
    m, c = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (m.allow_tf32, c.allow_tf32, torch.get_float32_matmul_precision(),
             m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    yield m, c
    m.allow_tf32, c.allow_tf32 = saved[0], saved[1]
    torch.set_float32_matmul_precision(saved[2])
    m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = saved[3], saved[4]


def test_tf32_is_a_finding_for_float32_on_cuda(cuda_flags):
    m, c = cuda_flags
    m.allow_tf32, c.allow_tf32 = False, False
    torch.set_float32_matmul_precision("highest")
    assert _precision_findings(_run_on_cuda(torch.float32), "float32") == []
    c.allow_tf32 = True                                      # cuDNN's default
    (f,) = _precision_findings(_run_on_cuda(torch.float32), "float32")
    assert f["kind"] == "dtype" and "torch.backends.cudnn.allow_tf32" in f["message"], f
    c.allow_tf32 = False
    torch.set_float32_matmul_precision("high")               # TF32 matmuls by the precision setting
    (f,) = _precision_findings(_run_on_cuda(torch.float32), "float32")
    assert "torch.backends.cuda.matmul.allow_tf32" in f["message"], f
    # on the CPU the same settings change nothing: no finding
    cpu = types.SimpleNamespace(out=torch.zeros(1), other_dtypes={})
    assert _precision_findings(cpu, "float32") == []


@pytest.mark.parametrize("dtype,flag", [("float16", "allow_fp16_reduced_precision_reduction"),
                                        ("bfloat16", "allow_bf16_reduced_precision_reduction")])
def test_reduced_precision_reduction_is_noted_for_half_on_cuda(cuda_flags, dtype, flag):
    m, _ = cuda_flags
    tdt = getattr(torch, dtype)
    setattr(m, flag, False)
    assert _precision_findings(_run_on_cuda(tdt), dtype) == []
    setattr(m, flag, True)                                   # torch's default
    (f,) = _precision_findings(_run_on_cuda(tdt), dtype)
    assert f["kind"] == "note" and flag in f["message"], f


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_port_matches_on_cuda(cuda_flags, dtype):
    m, c = cuda_flags
    m.allow_tf32, c.allow_tf32 = False, False
    torch.set_float32_matmul_precision("highest")
    m.allow_fp16_reduced_precision_reduction = False
    r = V.verify(PortFocusedAttention(16, 2, sr_ratio=2, n_kv=16), "flatten.attention", hw=(8, 8), dtype=dtype,
                 device="cuda")
    assert r.verdict == "match", str(r)
    rb = V.verify(PortFocusedAttention(16, 2, sr_ratio=2, n_kv=16, bug="batch_state"), "flatten.attention",
                  hw=(8, 8), dtype=dtype, device="cuda")
    assert rb.verdict == "diverges" and rb.first_divergence["stage"] == "attention", str(rb)
