"""setuptools shim: the one setup() keyword pyproject.toml cannot carry.

``cffi_modules`` makes the build compile ckernels/*.c into the extension module refimpl._native._kernels
(see build_ext.py).  All metadata lives in pyproject.toml.
"""

from setuptools import setup

setup(cffi_modules=["build_ext.py:ffibuilder"])
