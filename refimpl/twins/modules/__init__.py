"""The PyTorch twins of the attention modules (the layer twins the equivalence suite and the verify tool run)."""
