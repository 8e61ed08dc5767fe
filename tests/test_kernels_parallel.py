"""The C kernels' parallel runtime (ckernels/parallel.h) and the thread-count independence of every threaded
kernel.

1. The runtime's contract, through its self-test entry point (ckernels/parallel.c): every work item of every
   phase runs exactly once; phases run in order, each separated from the next by the serial step; a worker
   whose start fails claims nothing and the others still finish every item; tids stay inside the team.
2. Every threaded C entry point (linear attention with each feature map, key weights and V scale, RALA's
   alpha, Castling's linear-angular attention, window attention) returns the same bits for 1, 2, 3, 16, 64
   and 100 threads (more threads than work items, and more than the runtime's cap, included), on inputs with
   NaN, infinities, subnormals and zeros, at sizes above each kernel's one-thread threshold.
"""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.backends import _c, _c_linear, _c_softmax
from tests.kernel_helpers import backend_available

pytestmark = pytest.mark.skipif(not backend_available("c", "linear_attention"),
                                reason="the compiled C module is not built")

THREADS = (1, 2, 3, 16, 64, 100)
MAX_TEAM = 64   # PAR_MAX_THREADS


def selftest(items, nthreads, fail_mask=0):
    mod = _c._load()
    ffi, lib = mod.ffi, mod.lib
    items = np.ascontiguousarray(items, dtype=np.int64)
    runs = np.full(max(1, int(items.sum())), -1, dtype=np.int64)
    report = np.full(4, -1, dtype=np.int64)
    status = lib.refimpl_parallel_selftest(ffi.from_buffer("int64_t[]", runs, require_writable=True), runs.size,
                                           ffi.from_buffer("int64_t[]", items), items.size, nthreads, fail_mask,
                                           ffi.from_buffer("int64_t[]", report, require_writable=True))
    assert status == 0
    return runs[:int(items.sum())], report


@pytest.mark.parametrize("items", [(5,), (0, 7), (3, 100, 1, 64), (1000, 1000, 1000, 1000), (1, 0, 2)],
                         ids=lambda x: "-".join(map(str, x)))
@pytest.mark.parametrize("nthreads", THREADS)
@pytest.mark.parametrize("fail", ["none", "some", "all"])
def test_every_item_runs_once_per_phase_in_order(items, nthreads, fail):
    """Each item once, phases in order with the serial step between them, and the team is the caller plus
    the workers that started: a failed start (simulated) changes the team, never which items run."""
    workers = min(nthreads, MAX_TEAM) - 1
    mask = {"none": 0, "some": 0b1010_0110, "all": (1 << 63) - 2}[fail]
    started = sum(1 for k in range(1, workers + 1) if not (mask >> k) & 1)
    for _ in range(3):     # scheduling differs from run to run
        runs, (team, violations, tid_end, betweens) = selftest(items, nthreads, mask)
        assert (runs == 1).all(), runs
        assert violations == 0
        assert betweens == len(items) - 1
        assert team == 1 + started
        assert 1 <= tid_end <= team or sum(items) == 0


def test_selftest_refuses_bad_arguments_and_writes_nothing():
    mod = _c._load()
    ffi, lib = mod.ffi, mod.lib
    runs = np.full(4, -7, dtype=np.int64)
    report = np.full(4, -7, dtype=np.int64)
    rb, pb = (ffi.from_buffer("int64_t[]", a, require_writable=True) for a in (runs, report))
    for items, nphases, nthreads, code in (((5,), 1, 2, 1), ((2, 2), 0, 2, 1), ((-1,), 1, 2, 1), ((1,), 1, 0, 1)):
        ib = ffi.from_buffer("int64_t[]", np.array(items, dtype=np.int64))
        assert lib.refimpl_parallel_selftest(rb, runs.size, ib, nphases, nthreads, 0, pb) == code
    assert lib.refimpl_parallel_selftest(ffi.NULL, 4, ib, 1, 1, 0, pb) == 5
    assert (runs == -7).all() and (report == -7).all()


def _inputs(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, 40, replace=False)
    tiny = np.finfo(dtype).smallest_subnormal
    flat[idx] = np.array([np.nan, np.inf, -np.inf, tiny, -tiny, 0.0, -0.0, 1e-300 if dtype == np.float64 else 1e-40],
                         dtype=np.float64)[np.arange(40) % 8].astype(dtype)
    return x


def _cases(dtype):
    rng = np.random.default_rng(20261127)
    # linear attention: BH (N + M) d e = 3 * 3000 * 1024 > 2^23, the one-thread threshold
    q, k, v = (_inputs(rng, (1, 3, 1500, 32), dtype) for _ in range(3))
    clean = [rng.standard_normal((1, 3, 1500, 32)).astype(dtype) for _ in range(3)]
    alpha = rng.uniform(0.1, 2.0, (1, 3, 1500)).astype(dtype)
    vs = rng.uniform(0.5, 2.0, (1, 3, 1, 1)).astype(dtype)
    yield "relu", lambda t: _c_linear.linear_attention(q, k, v, "relu", 1e-6, threads=t)
    yield "elu1-clamp", lambda t: _c_linear.linear_attention(*clean, "elu1", 1e-3, "clamp", 1e-2, threads=t)
    yield "focused-vscale", lambda t: _c_linear.linear_attention(*clean, "focused", 1e-6, p=2.5, v_scale=vs,
                                                                  threads=t)
    yield "reweighted", lambda t: _c_linear.reweighted_linear_attention(*clean, alpha, "elu1", 1 / 1500, 1e-6,
                                                                        threads=t)
    yield "angular-own", lambda t: _c_linear.linear_angular_attention(q, k, v, "own", "similarity_sum", threads=t)
    # RALA's alpha: BH (N + M) d = 3 * 3000 * 32 > 2^20
    yield "rala-alpha", lambda t: _c_linear.rala_alpha(q, k, "kappa_q", "elu1", 32 ** -0.5, threads=t)
    yield "rala-alpha-q", lambda t: _c_linear.rala_alpha(*clean[:2], "q", "relu", 1.0, threads=t)
    # window attention: 64 windows x 3 heads of 49 tokens, above the threshold
    wq, wk, wv = (_inputs(rng, (64, 3, 49, 32), dtype) for _ in range(3))
    bias = rng.standard_normal((3, 49, 49)).astype(dtype)
    mask = rng.random((4, 49, 49)) < 0.8
    yield "window", lambda t: _c_softmax.window_softmax_attention(wq, wk, wv, 32 ** -0.5, bias, mask, threads=t)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_threaded_kernels_return_the_same_bits_for_every_thread_count(dtype):
    """The work items' boundaries depend on the sizes only and every partial is combined in item order, so
    each thread count gives the same bits (NaN payloads and signs of zero included)."""
    with np.errstate(all="ignore"):
        for name, run in _cases(dtype):
            first = run(1)
            for t in THREADS[1:]:
                got = run(t)
                assert got.tobytes() == first.tobytes(), f"{name}: {t} threads differ from 1 thread"
