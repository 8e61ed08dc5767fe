"""What the benchmark scripts share: the repository's paths, the host description and the plain timing loop.

Light on purpose (the standard library only): the scripts import it before they size their thread pools.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def machine() -> dict:
    """The host: platform, Python, CPU count, CPU model (Linux) and load average."""
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        info["load_average"] = os.getloadavg()
    except OSError:
        pass
    return info


def wall_times(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall times of ``repeats`` runs after one warm-up run (Numba compilation, allocator, caches)."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out
