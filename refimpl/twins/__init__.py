"""The PyTorch twins: torch modules that compute what refimpl's NumPy definitions compute, with the same
state_dict keys (refimpl.twins.modules: the attention modules and layers; refimpl.twins.models: every registered
network, ``build(name)``), and the taps through which a stage-wise comparison reads the tensors between their
submodules (refimpl.twins.taps).

Layer: the torch side of the package.  The twins import the NumPy side (configs, the exact arcsin coefficients,
the registry) and torch; nothing below them imports them: only the verify tool (refimpl.verify) and the
equivalence suite (equivalence/, which checks every twin against the reference through the error model) do.
They ship with the package so that ``python -m refimpl verify --grad`` works from a regular install.
"""
