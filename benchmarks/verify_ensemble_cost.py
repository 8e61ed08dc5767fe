"""What the verifier's torch ensemble costs and what it buys (docs/verify.md, "The ensemble").

Run (from the repository root; never part of the test suite):

    python benchmarks/verify_ensemble_cost.py

For gallery ports (tests/verify_gallery) at typical layer sizes, in float32 and float16: the wall time of
``refimpl.verify.verify`` with ``ensemble=False`` (the NumPy naive run and the random-rounding model) and with the
default ensemble (refimpl's twin re-run under refimpl.ensemble's variants, whole module and teacher-forced per
stage), the seconds the twin's runs took, both verdicts, and the whole module's zmax threshold with each ensemble.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from refimpl import verify as V  # noqa: E402
from tests.verify_gallery.flatten_port import PortFocusedAttention  # noqa: E402
from tests.verify_gallery.l2vit_port import PortL2ViTAttention  # noqa: E402
from tests.verify_gallery.rala_port import PortRALA  # noqa: E402

CASES = [
    ("FLatten-PVT stage 1 (C 64, 1 head, sr 8, 56 x 56, batch 1)",
     lambda: PortFocusedAttention(64, 1, sr_ratio=8, n_kv=49), "flatten.attention", dict(hw=(56, 56), batch=1)),
    ("L2ViT (C 96, 3 heads, 14 x 14, batch 2)", lambda: PortL2ViTAttention(96, 3), "l2vit.attention",
     dict(hw=(14, 14))),
    ("RALA (C 64, 2 heads, 14 x 14, batch 2)", lambda: PortRALA(64, 2), "rala.attention", dict(hw=(14, 14))),
    ("FLatten gallery port (C 16, 2 heads, sr 2, 8 x 8, batch 2)",
     lambda: PortFocusedAttention(16, 2, sr_ratio=2, n_kv=16), "flatten.attention", dict(hw=(8, 8))),
]


def main() -> None:
    for name, make, ref, kw in CASES:
        for dtype in ("float32", "float16"):
            t = time.perf_counter()
            off = V.verify(make(), ref, dtype=dtype, ensemble=False, **kw)
            t_off = time.perf_counter() - t
            t = time.perf_counter()
            on = V.verify(make(), ref, dtype=dtype, **kw)
            t_on = time.perf_counter() - t
            print(f"{name} {dtype}: {t_off:.1f} s without, {t_on:.1f} s with the ensemble (the twin's runs "
                  f"{on.ensemble['seconds']:.1f} s); verdicts {off.verdict} / {on.verdict}; whole-module zmax "
                  f"threshold {off.whole_module['ensemble']['zmax_threshold']:.3g} -> "
                  f"{on.whole_module['ensemble']['zmax_threshold']:.3g}", flush=True)


if __name__ == "__main__":
    main()
