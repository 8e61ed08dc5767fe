"""refimpl: a float64 NumPy/SciPy reference of vision linear-attention mechanisms and their networks.

Importing refimpl needs only NumPy and SciPy.  Numba and the compiled C kernels are optional accelerators
found at run time (see :mod:`refimpl.backends`); torch is never imported by refimpl.
"""

from . import config, numerics, backends, layers  # noqa: F401
# The modules that register the NumPy definitions of refimpl.backends' operations (refimpl.backends itself
# never imports them: it is below them in the import graph).
from .attention import angular, enhanced, focused, linear, lisa, lisa_local, rala, softmax  # noqa: F401,E402

__version__ = "0.1.0"
