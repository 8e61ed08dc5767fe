"""Home of the compiled cffi extension ``refimpl._native._kernels`` (built from ckernels/ by build_ext.py).

The module is an optional accelerator: nothing in refimpl imports it except refimpl.backends._c, which
reports its absence through :func:`refimpl.backends.available` instead of failing.  It is a build
product (not committed): ``pip install .`` / ``pip install -e .`` or ``python build_ext.py`` creates it.
"""
