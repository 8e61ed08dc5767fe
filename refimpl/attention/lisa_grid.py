"""The sizes every LiSA configuration derives from its grid and heads (LiSA §4.3, Table 3c): one mixin shared by
the global operator's configs (refimpl.attention.lisa) and the local one's (refimpl.attention.lisa_local).

Layer: the reference (refimpl.attention); imports NumPy only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GridHeads"]


class GridHeads:
    """The derived sizes of a LiSA configuration on a token grid (a mixin of the frozen configs, no fields): the
    head dimension, the grid's token count and axes, and the kernel's entry count.  Each config defines ``dim``,
    ``num_heads``, ``grid`` and ``kernel_grid``: :class:`refimpl.attention.lisa.LiSAConfig` and ``SAConfig`` (the
    RPE kernels' grid), :class:`refimpl.attention.lisa_local.LocalLiSAConfig` (the local window)."""

    @property
    def head_dim(self) -> int:
        """c = C / h, the head dimension."""
        return self.dim // self.num_heads

    @property
    def num_tokens(self) -> int:
        """N, the number of tokens of the grid."""
        return int(np.prod(self.grid))

    @property
    def ndim(self) -> int:
        """The number of grid axes (1, 2 or 3)."""
        return len(self.grid)

    @property
    def kernel_tokens(self) -> int:
        """The number of entries of ``kernel_grid`` (the RPE kernels' first axis)."""
        return int(np.prod(self.kernel_grid))
