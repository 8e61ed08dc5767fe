"""Calibration of the verdict's ensemble factors on the network units (the equivalence suite's comparisons).

For every registered network and attention preset, the reduced model's units (stem, blocks, downsamplings,
head) are evaluated in float32 by the PyTorch twin under every legitimate variant (refimpl.ensemble.VARIANTS),
by its default algorithms and by the NumPy definition run in float32.  Each evaluation is left out in turn and
its zmax / zrms (refimpl.verdict) divided by the largest over the others.  Recursive summation is always a
member of the verdict's ensemble; its ratio against the others alone is reported but not used for the factor.

    python benchmarks/verdict_units.py        # writes benchmarks/results/verdict_units.json

benchmarks/verdict.py folds the result into docs/verdict.md.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import refimpl.twins.models as em  # noqa: E402
import refimpl.models as rm  # noqa: E402
from equivalence.assertions import load_numpy_state, naive, round_params, to_numpy, to_torch  # noqa: E402
from equivalence.test_models import BATCH, SEED, _cases, image_hw, small_config  # noqa: E402
from refimpl import numerics  # noqa: E402
from refimpl.ensemble import VARIANTS, legitimate_runs  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "verdict_units.json"
ALWAYS_PRESENT = ("recursive",)


def main() -> None:
    t0 = time.time()
    dt = "float32"
    per_member: dict[str, list[float]] = {}
    worst = {"max": (0.0, None), "rms": (0.0, None)}
    for name, preset in _cases():
        fam, cfg = rm.family_of(name), small_config(name, preset)
        params = round_params(fam.init_params(cfg, np.random.default_rng(SEED)), dt)
        x = numerics.round_to(np.random.default_rng(SEED + 1).standard_normal(
            (BATCH, cfg.in_chans, *image_hw(fam, cfg))), dt)
        twin = em.build(cfg).to(dtype=torch.float32)
        load_numpy_state(twin, params)
        twin.eval()
        for unit in fam.unit_names(cfg):
            ref, bnd = fam.run_unit(params, unit, x, cfg), fam.unit_bound(params, unit, x, cfg, dtype=dt)
            xt = to_torch(x, dt, "cpu")
            outs = {k: to_numpy(v) for k, v in
                    legitimate_runs(lambda u=unit: twin.run_unit(u, xt), variants=VARIANTS).items()}
            with torch.no_grad():
                outs["torch default"] = to_numpy(twin.run_unit(unit, xt))
            outs["numpy naive"] = naive(fam.run_unit, params, unit, x, cfg, dtype_name=dt)
            rep = numerics.compare(outs["torch default"], ref, bnd, dt,
                                   ensemble={k: v for k, v in outs.items() if k != "torch default"})
            stats = {k: v for k, v in rep.ensemble.items() if k in outs}
            stats["torch default"] = (rep.zmax, rep.zrms)
            for k, (zm, zr) in stats.items():
                others = [v for kk, v in stats.items() if kk != k]
                rmax = zm / max(o[0] for o in others) if max(o[0] for o in others) > 0 else 0.0
                rrms = zr / max(o[1] for o in others) if max(o[1] for o in others) > 0 else 0.0
                per_member.setdefault(k, [0.0, 0.0])
                per_member[k] = [max(per_member[k][0], rmax), max(per_member[k][1], rrms)]
                if k not in ALWAYS_PRESENT:
                    for key, r in (("max", rmax), ("rms", rrms)):
                        if r > worst[key][0]:
                            worst[key] = (r, f"{name}/{preset} {unit} [{k}]")
            x = numerics.round_to(ref, dt)
        print(f"{name}/{preset}: largest so far max {worst['max'][0]:.3g}, rms {worst['rms'][0]:.3g}", flush=True)
    result = {"dtype": dt, "per_member": per_member, "worst_max": worst["max"], "worst_rms": worst["rms"],
              "always_present": list(ALWAYS_PRESENT), "seconds": round(time.time() - t0, 1),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    OUT.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
