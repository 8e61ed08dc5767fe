"""Ad-hoc timing of the fused linear-attention C kernels against NumPy and PyTorch CPU eager (not a test).

    PYTHONPATH=. python benchmarks/linattn_c.py [--dtypes float64,float32] [--ops linear_relu,...]

Everything runs in one process and time window: the float64/float32 matmul peak (numpy, 1024^3), then
for each thread count (1, 2; OpenBLAS and torch set to the same count) each workload on the same inputs:
the C kernel writing into a reused 64-byte aligned out= with a reused workspace=, the NumPy definition, and
the equivalent torch eager code.  Median of repeats after two warm-up calls.  FLOPs counted per head as
4 N d e (the two products) + 2 N d (normaliser) + N e (quotient) for M = N.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import math
import os
import time

import numpy as np
import torch

from refimpl import backends
from refimpl.attention import linear, rala
from refimpl.backends import _c, _c_linear, _c_softmax

_OB = None
for lib in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "libscipy_openblas*.so")):
    _OB = ctypes.CDLL(lib)


@contextlib.contextmanager
def blas_threads(n):
    if _OB is not None:
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads"):
            if hasattr(_OB, name):
                getattr(_OB, name)(n)
                break
    yield


def med(f, reps):
    f()
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def peak(dt, n=1024):
    a, b = np.random.rand(n, n).astype(dt), np.random.rand(n, n).astype(dt)
    c = np.empty((n, n), dt)
    return 2 * n ** 3 / med(lambda: np.matmul(a, b, out=c), 7) / 1e9


def torch_linear(q, k, v, fm):
    pq, pk = (torch.relu(q), torch.relu(k)) if fm == "relu" else (torch.nn.functional.elu(q) + 1,
                                                                  torch.nn.functional.elu(k) + 1)
    kv = pk.transpose(-1, -2) @ v
    den = (pq * pk.sum(-2, keepdim=True)).sum(-1, keepdim=True)
    return (pq @ kv) / den


def torch_rala(q, k, v, alpha):
    kq, kk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    kw = alpha[..., None] * kk
    kv = kw.transpose(-1, -2) @ v
    den = (kq * kw.sum(-2, keepdim=True)).sum(-1, keepdim=True)
    return (kq @ kv) / den


def torch_castling(q, k, v):
    qh, kh = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    return 0.5 * v.sum(-2, keepdim=True) + (1 / math.pi) * (qh @ (kh.transpose(-1, -2) @ v))


def torch_window(q, k, v, scale, bias, mask):
    s = (q * scale) @ k.transpose(-1, -2) + bias
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def bench_window(nt, dt, pk):
    """Swin 7 x 7 windows at 56 x 56, 96 channels (3 heads, d = 32), shifted: the per-window core."""
    from refimpl.attention import softmax
    from refimpl.layers import shifted_window_mask
    rng = np.random.default_rng(0)
    bw, h, n, d = 64, 3, 49, 32
    q, k, v = (rng.standard_normal((bw, h, n, d)).astype(dt) for _ in range(3))
    bias = rng.standard_normal((h, n, n)).astype(dt)
    mask = shifted_window_mask(56, 56, (7, 7), (3, 3))
    out = backends.empty_aligned(q.shape, dt)
    ws = backends.empty_aligned(int(_c._load().lib.refimpl_window_attention_workspace(n, n, d, nt)), dt)
    tq, tk, tv, tb = (torch.from_numpy(a) for a in (q, k, v, bias))
    tm = torch.from_numpy(np.tile(mask, (bw // mask.shape[0], 1, 1))[:, None])
    sc = d ** -0.5
    with torch.no_grad():
        tc = med(lambda: _c_softmax.window_softmax_attention(q, k, v, sc, bias, mask, out=out, workspace=ws, threads=nt), 15)
        tn = med(lambda: softmax._window_softmax_attention_numpy(q, k, v, sc, bias, mask), 5)
        tt = med(lambda: torch_window(tq, tk, tv, sc, tb, tm), 15)
    fl = bw * h * (4 * n * n * d + 5 * n * n)
    print(f"  {'window 7x7':12s} 56x56 C=96 h=3: C {tc * 1e3:8.3f} ms {fl / tc / 1e9:5.1f} GF/s "
          f"({fl / tc / 1e9 / pk * 100:3.0f}% of peak) | numpy {tn * 1e3:8.3f} ms | torch {tt * 1e3:8.3f} ms | "
          f"C/torch {tc / tt:5.2f} C/numpy {tc / tn:5.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float64")
    ap.add_argument("--ops", default="linear_relu,linear_elu1,rala,castling,window")
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    cases = [(3136, 32, 3), (16384, 32, 3), (65536, 32, 3), (196, 64, 3)]
    for nt in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(nt)
        with blas_threads(nt):
            for dn in args.dtypes.split(","):
                dt = np.dtype(dn)
                pk = peak(dt)
                print(f"threads={nt} {dn}: numpy matmul peak {pk:.1f} GFLOP/s (load {os.getloadavg()[0]:.1f})")
                for op in args.ops.split(","):
                    if op == "window":
                        bench_window(nt, dt, pk)
                        continue
                    for n, d, h in cases:
                        rng = np.random.default_rng(0)
                        q, k, v = (rng.standard_normal((1, h, n, d)).astype(dt) for _ in range(3))
                        alpha = (rng.random((1, h, n)) * 2).astype(dt)
                        out = backends.empty_aligned(q.shape, dt)
                        ws = _c_linear.linear_attention_workspace(1, h, n, d, d, dt, nt)
                        reps = 15 if n <= 3136 else 7
                        tq, tk, tv, ta = (torch.from_numpy(a) for a in (q, k, v, alpha))
                        if op.startswith("linear"):
                            fm = op.split("_")[1]
                            fc = lambda: _c_linear.linear_attention(q, k, v, fm, out=out, workspace=ws, threads=nt)
                            fn = lambda: linear._linear_attention_numpy(q, k, v, fm)
                            ft = lambda: torch_linear(tq, tk, tv, fm)
                        elif op == "rala":
                            fc = lambda: _c_linear.reweighted_linear_attention(q, k, v, alpha, "elu1", out=out, workspace=ws,
                                                                        threads=nt)
                            fn = lambda: rala._reweighted_linear_attention_numpy(q, k, v, alpha, "elu1")
                            ft = lambda: torch_rala(tq, tk, tv, ta)
                        else:
                            fc = lambda: _c_linear.linear_angular_attention(q, k, v, out=out, workspace=ws, threads=nt)
                            fn = lambda: backends.definition("linear_angular_attention")(q, k, v)
                            ft = lambda: torch_castling(tq, tk, tv)
                        with torch.no_grad(), np.errstate(all="ignore"):
                            tc = med(fc, reps)
                            tn = med(fn, max(3, reps // 3))
                            tt = med(ft, reps)
                        fl = h * (4 * n * d * d + 3 * n * d)
                        print(f"  {op:12s} N={n:6d} d={d} h={h}: C {tc * 1e3:8.3f} ms {fl / tc / 1e9:5.1f} GF/s "
                              f"({fl / tc / 1e9 / pk * 100:3.0f}% of peak) | numpy {tn * 1e3:8.3f} ms | "
                              f"torch {tt * 1e3:8.3f} ms | C/torch {tc / tt:5.2f} C/numpy {tc / tn:5.2f}",
                              flush=True)


if __name__ == "__main__":
    main()
