"""RALA's range policy: what :func:`refimpl.attention.rala.rala_attention` does with a non-finite output
(docs/guarantees.md, "range safety").

Layer: attention, a part of RALA (:mod:`refimpl.attention.rala`, which imports it): imports NumPy and
:mod:`.rala_core` (the configuration) only.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .rala_core import RALAConfig

__all__: list[str] = []


def _check_output_range(x: np.ndarray, params: Mapping[str, Any], cfg: RALAConfig, t: Mapping[str, Any]) -> None:
    """The range policy of :func:`rala_attention` for a non-finite output (docs/guarantees.md): nothing where an
    input (x or a parameter) is not finite (NaN and Inf propagate) or where the core's NaN is the undefined 0/0
    of a dead relu row with eps = 0; otherwise FloatingPointError naming the first stage whose value is not
    finite.  The exact result is finite there (ELU + 1 and the softmax weights alpha are > 0, eps > 0 else), so
    a non-finite value means float64 cannot hold it: a projection or the output overflows, or the core's
    normaliser underflows to 0 (exp of 1e150-sized negative pre-activations; only log-domain scaling could
    avoid it) or its quotient overflows."""
    if not np.all(np.isfinite(x)) or not all(np.all(np.isfinite(np.asarray(p, dtype=np.float64)))
                                             for p in params.values()):
        return
    stages = [("the q, k, v and gate projections", [t["q"], t["k"], t["v"]] + ([t["gate"]] if t["gate"] is not None
                                                                            else [])),
              ("the reweighted core (RALA Eq. 2-4; its normaliser underflows to 0 or its quotient overflows)",
               [t["core"]])]
    if "lepe" in t:
        stages.append(("LePE", [t["lepe"]]))
    stages.append(("the gate product and the output projection (RALA Eq. 6)", [t["out"]]))
    for stage, values in stages:
        if all(np.all(np.isfinite(a)) for a in values):
            continue
        if stage.startswith("the reweighted core") and cfg.kernel == "relu" and not cfg.eps \
                and not np.any(np.isinf(t["core"])):
            return          # a dead relu row with eps = 0: 0/0, undefined (the documented NaN)
        raise FloatingPointError(f"rala_attention: {stage} gives a non-finite value from finite inputs: float64 "
                                 f"cannot compute this stage's (finite) result for inputs of this magnitude")
