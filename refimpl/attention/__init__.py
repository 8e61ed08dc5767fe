"""Attention mechanisms, one file per family (see docs/design.md)."""
