"""The registered references of the verify tool, by name (``refimpl verify --list``).

Layer: the verify tool; above :mod:`.references` (the layer references and their shared inference) and
:mod:`.windows` (the shifted-window references, which extend them).
"""

from __future__ import annotations

from .loading import VerifyError
from .references import CastlingAttention, L2ViTAttention, LiSAAttention, RALAAttention, Reference
from .windows import FlattenAttentionLayouts, SoftmaxWindowAttention

__all__ = ["REFERENCES", "get_reference"]

REFERENCES: dict[str, Reference] = {r.name: r for r in (
    FlattenAttentionLayouts(), L2ViTAttention(), RALAAttention(), CastlingAttention(), LiSAAttention(),
    SoftmaxWindowAttention())}


def get_reference(name: str) -> Reference:
    """The layer reference ``name`` (``refimpl verify --list``); VerifyError naming the choices otherwise."""
    if name not in REFERENCES:
        raise VerifyError(f"argument 'reference': expected one of {sorted(REFERENCES)} or a registered network "
                          f"(refimpl verify --list), got {name!r}")
    return REFERENCES[name]
