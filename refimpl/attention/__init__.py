"""Attention mechanisms, one file per family (see DESIGN.md)."""
