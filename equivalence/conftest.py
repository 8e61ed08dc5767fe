"""Devices and dtypes of the equivalence suite.

``device``: "cpu" always, "cuda" when torch.cuda.is_available().  On CUDA, TF32 is switched off for
matmul and cuDNN (TF32 would carry a 10-bit significand and break the float32 error model) and
deterministic algorithms are required, so a CUDA run is reproducible and its float32 is IEEE float32.
``dtype_name``: "float32" and "float64", the two precisions every module is compared in.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_configure(config):
    torch.use_deterministic_algorithms(True, warn_only=False)
    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.set_float32_matmul_precision("highest")


@pytest.fixture(scope="session", params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(scope="session", params=["float32", "float64"])
def dtype_name(request) -> str:
    return request.param
