"""Devices and dtypes of the equivalence suite.

``device``: "cpu" always, "cuda" when torch.cuda.is_available().  On CUDA, TF32 is switched off for
matmul and cuDNN (TF32 would carry a 10-bit significand and break the float32 error model) and
deterministic algorithms are required, so a CUDA run is reproducible and its float32 is IEEE float32.
``dtype_name``: "float32" and "float64", the two precisions every module is compared in.

Other legitimate algorithms, for running the whole suite as another machine would (the verdict must accept
them all): ``REFIMPL_TORCH_ONEDNN=0`` switches oneDNN (mkldnn) off, ``REFIMPL_TORCH_THREADS=N`` sets torch's
intra-op thread count, and ``REFIMPL_EMULATE_CUDA_CONV=1`` gives a CPU run the convolution bounds of a CUDA run
(below), so that what CUDA's algorithm choice does to the verdicts can be checked without a GPU.

The convolution algorithms the bounds cover (refimpl.bounds.covering_conv_algorithms): with oneDNN off PyTorch's
CPU convolution takes NNPACK for float32 inputs of batch >= 16 (config.NNPACK_MIN_BATCH), whose Winograd
F(6x6, 3x3) and 8 x 8 / 16 x 16 FFT tiles err far beyond a direct convolution's bound (up to 10^5 times it next
to a large input); cuDNN may choose Winograd or tiled FFT at any batch and precision.  There the convolution
bounds also cover Winograd and tiled FFT (wider, as those algorithms' errors are); on the default CPU path
(oneDNN) the bounds are the direct convolution's.
"""

from __future__ import annotations

import os

import pytest
import torch

from refimpl import bounds, config, ensemble

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_configure(config):
    torch.use_deterministic_algorithms(True, warn_only=False)
    if os.environ.get("REFIMPL_TORCH_ONEDNN", "1") == "0":
        torch._C._set_mkldnn_enabled(False)
    if os.environ.get("REFIMPL_TORCH_THREADS"):
        torch.set_num_threads(int(os.environ["REFIMPL_TORCH_THREADS"]))
    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.set_float32_matmul_precision("highest")
        # The error model assumes half-precision sums accumulate in float32 (config.ACCUMULATION_FORMAT);
        # cuBLAS's reduced-precision split-K reductions would round partial sums to T.
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


@pytest.fixture(scope="session", params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(scope="session", params=["float32", "float64"])
def dtype_name(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def conv_algorithms_of_this_run(request):
    """Every test's bounds cover the convolution algorithms its torch run may take (module docstring)."""
    cuda = "device" in request.fixturenames and request.getfixturevalue("device") == "cuda" \
        or os.environ.get("REFIMPL_EMULATE_CUDA_CONV", "0") == "1"
    dtype = request.getfixturevalue("dtype_name") if "dtype_name" in request.fixturenames else None
    if cuda:
        algorithms, min_batch = ("winograd", "fft"), 1
    elif ensemble.nnpack_may_run(dtype or "float32"):           # NNPACK: float32, batch >= 16
        algorithms, min_batch = ("winograd", "fft"), config.NNPACK_MIN_BATCH
    else:
        algorithms, min_batch = (), 1
    with bounds.covering_conv_algorithms(*algorithms, min_batch=min_batch):
        yield algorithms
