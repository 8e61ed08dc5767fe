"""The workloads of benchmarks/run.py: the refimpl call and the PyTorch eager equivalent of each, on the same
inputs, with their nominal FLOP counts (``np`` and ``torch`` are passed in: the worker imports them after it has
sized the thread pools).
"""

from __future__ import annotations

import math


class Workload:
    """name, dtype, flops, refimpl callable (run under each backend), torch callable, series/N for fits."""

    def __init__(self, name, dtype, flops, flop_note, ref, torch_fn=None, series=None, n=None, direct=None):
        self.name, self.dtype, self.flops, self.flop_note = name, dtype, flops, flop_note
        self.ref, self.torch_fn, self.series, self.n = ref, torch_fn, series, n
        self.direct = direct or {}   # backend -> callable that bypasses the switch (e.g. kernels with out=)


def qkv(np, b, h, n, d, dt, seed=0, e=None):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((b, h, n, dd)).astype(dt) for dd in (d, d, e or d))


def workloads_dwconv(np, torch, quick):
    from refimpl import backends, layers
    out = []
    for (shape, kk) in (((1, 96, 56, 56), 7), ((1, 384, 14, 14), 3)):
        for dt in ("float64", "float32"):
            rng = np.random.default_rng(0)
            c = shape[1]
            x = rng.standard_normal(shape).astype(dt)
            w = rng.standard_normal((c, 1, kk, kk)).astype(dt)
            bias = rng.standard_normal(c).astype(dt)
            p = kk // 2
            pads = (p, p, p, p)
            flops = 2 * c * shape[2] * shape[3] * kk * kk
            direct = {"op": "depthwise_conv2d"}
            for bname in ("numba", "c"):
                impl = backends._REGISTRY["depthwise_conv2d"].get(bname)
                if impl is not None:
                    buf = backends.empty_aligned(shape, dt)
                    direct[bname] = (lambda impl=impl, buf=buf, x=x, w=w, bias=bias, pads=pads:
                                     impl(x, w, bias, (1, 1), pads, out=buf))
            tfn = None
            if torch is not None:
                tx, tw, tb = (torch.from_numpy(a) for a in (x, w, bias))
                tfn = (lambda tx=tx, tw=tw, tb=tb, p=p, c=c:
                       torch.nn.functional.conv2d(tx, tw, tb, padding=p, groups=c))
            out.append(Workload(f"depthwise {kk}x{kk} {shape}", dt, flops, "2 C H W KH KW",
                                lambda x=x, w=w, bias=bias, p=p: layers.depthwise_conv2d(x, w, bias, padding=p),
                                tfn, direct=direct))
    return out


# --- linear attention families: refimpl calls and PyTorch eager equivalents -----------------------

def _fam_relu(np, q, k, v):
    from refimpl.attention import linear
    return lambda: linear.linear_attention(q, k, v, feature_map="relu")


def _fam_l2vit(np, q, k, v):
    from refimpl.attention import enhanced
    return lambda: enhanced.enhanced_linear_attention(q, k, v)


def _fam_focused(np, q, k, v):
    from refimpl.attention import focused
    return lambda: focused.focused_attention(q, k, v)


def _fam_rala(np, q, k, v):
    from refimpl.attention import rala
    cfg = rala.RALAConfig(dim=q.shape[1] * q.shape[3], num_heads=q.shape[1])
    return lambda: rala.rala_core(q, k, v, cfg)


def _fam_castling(np, q, k, v):
    from refimpl.attention import angular
    return lambda: angular.linear_angular_attention(q, k, v)


LINEAR_FAMILIES = {"relu (generic)": _fam_relu, "L2ViT": _fam_l2vit, "FLatten focused": _fam_focused,
                   "RALA": _fam_rala, "Castling": _fam_castling}


def _torch_linear(torch, fam):
    """PyTorch eager code a user would write for each family (what the released code computes for the
    paper preset's equations; same inputs)."""
    F = torch.nn.functional
    from refimpl import config

    def attend(pq, pk, v, clamp=None):
        kv = pk.transpose(-1, -2) @ v
        ks = pk.sum(dim=-2, keepdim=True)
        den = (pq * ks).sum(dim=-1, keepdim=True)
        if clamp is not None:
            den = den.clamp(min=clamp)
        return (pq @ kv) / den

    if fam == "relu (generic)":
        return lambda q, k, v: attend(F.relu(q), F.relu(k), v)
    if fam == "L2ViT":
        return lambda q, k, v: attend(F.relu(q), F.relu(k), v, clamp=config.L2VIT_C_MIN)
    if fam == "FLatten focused":
        p = config.FLATTEN_FOCUSING_FACTOR

        def focus(x):
            x = F.relu(x)
            t = x ** p
            return x.norm(dim=-1, keepdim=True) / t.norm(dim=-1, keepdim=True) * t
        return lambda q, k, v: attend(focus(q), focus(k), v)
    if fam == "RALA":
        def rala(q, k, v):
            kq, kk = F.elu(q) + 1, F.elu(k) + 1
            qg = q.mean(dim=-2, keepdim=True)
            alpha = k.shape[-2] * torch.softmax((qg @ kk.transpose(-1, -2)), dim=-1)   # (B,h,1,N)
            kw = alpha.transpose(-1, -2) * kk
            return attend(kq, kw, v)
        return rala
    if fam == "Castling":
        def castling(q, k, v):
            qh, kh = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
            return 0.5 * v.sum(dim=-2, keepdim=True) + (qh @ (kh.transpose(-1, -2) @ v)) / math.pi
        return castling
    raise KeyError(fam)


def _reused_buffers_linear(np, q, k, v):
    """The fused C kernel called directly with a 64-byte aligned out= and workspace= allocated once and
    reused across calls (steady-state memory): operation "linear_attention", ReLU map.  The
    family rows call the reference functions, which allocate both on every call like any function that
    returns a fresh array; this row shows what the reuse saves."""
    from refimpl import backends
    impl = backends._REGISTRY.get("linear_attention", {}).get("c")
    if impl is None or not backends.available()["c"].ok:
        return {}
    from refimpl.backends import _c_linear
    b, h, n, d = q.shape
    buf = backends.empty_aligned(q.shape[:3] + v.shape[3:], q.dtype)
    ws = _c_linear.linear_attention_workspace(b, h, k.shape[2], d, v.shape[3], q.dtype)
    return {"op": "linear_attention", "c": lambda: impl(q, k, v, "relu", out=buf, workspace=ws)}


def workloads_linear(np, torch, quick):
    sizes = [(196, 64, 1)] + [(n, 32, 3) for n in ((3136, 16384) if quick else (3136, 16384, 65536))]
    out = []
    for fam, make in LINEAR_FAMILIES.items():
        tf = _torch_linear(torch, fam) if torch is not None else None
        for n, d, h in sizes:
            if d == 64:
                h = 3     # N = 196, d = 64: 3 heads (C = 192)
            for dt in ("float64", "float32"):
                q, k, v = qkv(np, 1, h, n, d, dt)
                tfn = None
                if tf is not None:
                    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
                    tfn = (lambda tf=tf, tq=tq, tk=tk, tv=tv: tf(tq, tk, tv))
                flops = h * (4 * n * d * d + 3 * n * d)
                out.append(Workload(f"linattn {fam} N={n} d={d} h={h}", dt, flops,
                                    "4 N d e + 3 N d per head", make(np, q, k, v), tfn,
                                    series=f"linattn {fam} d=32" if d == 32 else None, n=n))
                if fam == "relu (generic)":
                    out.append(Workload(f"linattn relu, reused out=/workspace= N={n} d={d} h={h}", dt, flops,
                                        "4 N d e + 3 N d per head", make(np, q, k, v), tfn, n=n,
                                        direct=_reused_buffers_linear(np, q, k, v)))
    return out


def workloads_window(np, torch, quick):
    from refimpl.attention import softmax
    from refimpl import layers
    out = []
    hgt = wid = 56
    c, heads, ws = 96, 3, 7
    rng = np.random.default_rng(0)
    for dt in ("float64", "float32"):
        x = rng.standard_normal((1, hgt, wid, c)).astype(dt)
        p = {"qkv.weight": (rng.standard_normal((3 * c, c)) / math.sqrt(c)).astype(dt),
             "qkv.bias": rng.standard_normal(3 * c).astype(dt) * 0.1,
             "proj.weight": (rng.standard_normal((c, c)) / math.sqrt(c)).astype(dt),
             "proj.bias": rng.standard_normal(c).astype(dt) * 0.1,
             "relative_position_bias_table": rng.standard_normal(((2 * ws - 1) ** 2, heads)).astype(dt) * 0.1}
        n_tok, n_win, d = ws * ws, (hgt // ws) * (wid // ws), c // heads
        flops = n_win * (2 * n_tok * c * 3 * c + 2 * n_tok * c * c + heads * 4 * n_tok * n_tok * d)
        tfn = None
        if torch is not None:
            idx = layers.relative_position_index(ws, ws)
            tp = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in p.items()}
            tidx = torch.from_numpy(np.asarray(idx, dtype=np.int64))
            tx = torch.from_numpy(x)

            def tfn(tx=tx, tp=tp, tidx=tidx):
                F = torch.nn.functional
                b = tx.shape[0]
                xw = tx.view(b, hgt // ws, ws, wid // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, n_tok, c)
                qkv_ = F.linear(xw, tp["qkv.weight"], tp["qkv.bias"]).reshape(-1, n_tok, 3, heads, d)
                qkv_ = qkv_.permute(2, 0, 3, 1, 4)
                q, k, v = qkv_[0], qkv_[1], qkv_[2]
                attn = (q * d ** -0.5) @ k.transpose(-2, -1)
                bias = tp["relative_position_bias_table"][tidx.view(-1)].view(n_tok, n_tok, -1).permute(2, 0, 1)
                attn = torch.softmax(attn + bias.unsqueeze(0), dim=-1)
                o = (attn @ v).transpose(1, 2).reshape(-1, n_tok, c)
                o = F.linear(o, tp["proj.weight"], tp["proj.bias"])
                return o.view(b, hgt // ws, wid // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hgt, wid, c)
        out.append(Workload("window attn 7x7 56x56 C=96 h=3", dt, flops,
                            "qkv + proj matmuls + 4 n^2 d per window and head",
                            lambda x=x, p=p: softmax.window_attention(x, p, num_heads=heads, window_size=ws), tfn))
    return out


def workloads_lisa(np, torch, quick):
    from refimpl.attention import lisa
    cases = [((14, 14), 192, 6, "LiSA 14x14 C=192 D=16"), ((56, 56), 64, 2, "LiSA 56x56 C=64 D=16")]
    series = [((s, s), 64, 2) for s in ((14, 28) if quick else (14, 28, 56, 112))]
    out = []
    dd = 16
    for grid, c_all, h, name, ser in [(g, c, h, nm, None) for g, c, h, nm in cases] + \
            [(g, c, h, f"LiSA {g[0]}x{g[1]} C={c} (scaling)", "lisa C=64") for g, c, h in series]:
        n = grid[0] * grid[1]
        c = c_all // h
        for dt in ("float64", "float32"):
            if ser and dt == "float32":
                continue
            rng = np.random.default_rng(0)
            q, k, v = qkv(np, 1, h, n, c, dt)
            wa = (rng.standard_normal((n, c, dd)) / n).astype(dt)
            wb = (rng.standard_normal((n, dd)) / n).astype(dt)
            ba, bb = (rng.standard_normal((c, dd)) * 0.1).astype(dt), (rng.standard_normal((c, dd)) * 0.1).astype(dt)
            fft = 5 * n * math.log2(n) / 2 * (2 * c * dd + c)
            flops = h * (4 * n * c * dd + fft)
            tfn = None
            if torch is not None:
                t = {kk: torch.from_numpy(a) for kk, a in dict(q=q, k=k, v=v, wa=wa, wb=wb, ba=ba, bb=bb).items()}

                def tfn(t=t, grid=grid, n=n, c=c, h=h):
                    F = torch.nn.functional
                    qb, kb = F.normalize(t["q"], dim=-1), F.normalize(t["k"], dim=-1)
                    gshape = (1, h) + grid
                    dims = (2, 3)
                    kf = torch.fft.rfftn(kb.reshape(gshape + (c, 1)), dim=dims)
                    waf = torch.fft.rfftn(t["wa"].reshape(grid + (c, dd)), dim=(0, 1))
                    ga = torch.fft.irfftn(kf * waf, s=grid, dim=dims).reshape(1, h, n, c, dd)
                    vf = torch.fft.rfftn(t["v"].reshape(gshape + (c, 1)), dim=dims)
                    wbf = torch.fft.rfftn(t["wb"].reshape(grid + (1, dd)), dim=(0, 1))
                    gb = torch.fft.irfftn(vf * wbf, s=grid, dim=dims).reshape(1, h, n, c, dd)
                    s = torch.einsum("bhnc,bhncd->bhnd", qb, ga + t["ba"])
                    return torch.einsum("bhnd,bhnvd->bhnv", s, gb + t["bb"])
            out.append(Workload(name, dt, flops, "contraction 4 N c D + rfft 2.5 N log2 N per channel, per head",
                                lambda q=q, k=k, v=v, wa=wa, wb=wb, ba=ba, bb=bb, grid=grid:
                                lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid), tfn, series=ser, n=n))
    return out


def workloads_ops(np, torch, quick):
    """The Numba operations on their own (refimpl/backends/_numba*.py): the NumPy twin (the "numpy"
    column), the registered Numba kernel with a reused out= buffer, and the PyTorch eager expression."""
    from refimpl import backends
    from refimpl.attention import lisa_cores
    out = []
    reg = backends._REGISTRY
    n = 3136 if quick else 16384

    def direct(op, args, shape_dtype):
        d = {"op": op}
        impl = reg[op].get("numba")
        if impl is not None:
            buf = backends.empty_aligned(*shape_dtype)
            d["numba"] = lambda: impl(*args, out=buf)
        return d

    for dt in ("float64", "float32"):
        rng = np.random.default_rng(0)
        # LiSA contraction at 56x56, C = 64 (h = 2, c = 32), D = 16
        m, c, dd = 3136, 32, 16
        qb = rng.standard_normal((1, 2, m, c)).astype(dt)
        a, bv = (rng.standard_normal((1, 2, m, c, dd)).astype(dt) for _ in range(2))
        tfn = None
        if torch is not None:
            tq, ta, tb = (torch.from_numpy(x) for x in (qb, a, bv))
            tfn = (lambda tq=tq, ta=ta, tb=tb: torch.einsum("bhnd,bhnvd->bhnv",
                                                            torch.einsum("bhnc,bhncd->bhnd", tq, ta), tb))
        out.append(Workload("op lisa_contraction 56x56 c=32 D=16 h=2", dt, 2 * 4 * m * c * dd, "4 N c D per head",
                            lambda qb=qb, a=a, bv=bv: lisa_cores._lisa_contraction_numpy(qb, a, bv)[1], tfn,
                            direct=direct("lisa_contraction", (qb, a, bv), ((1, 2, m, c), dt))))
        # LiSA's local operator (Table 3c): the k x k window convolution of c = 32 channels into D = 16 on a
        # 56x56 grid, 2 heads; torch's expression is the same depthwise correlation with channel multiplier D
        # (conv2d, groups = c), in torch's channels-first output layout (no transpose counted on its side)
        for ksz in (3, 7):
            xl = rng.standard_normal((1, 2, m, c)).astype(dt)
            wl = rng.standard_normal((ksz * ksz, c, dd)).astype(dt)
            tfn = None
            if torch is not None:
                tx = torch.from_numpy(xl.reshape(2, 56, 56, c).transpose(0, 3, 1, 2).copy())
                tw = torch.from_numpy(wl.reshape(ksz, ksz, c, dd).transpose(2, 3, 0, 1).reshape(c * dd, 1, ksz, ksz)
                                      .copy())
                tfn = (lambda tx=tx, tw=tw, ksz=ksz: torch.nn.functional.conv2d(tx, tw, padding=ksz // 2, groups=c))
            out.append(Workload(f"op lisa_local_convolve 56x56 k={ksz} c=32 D=16 h=2", dt, 2 * 2 * m * c * dd * ksz ** 2,
                                "2 N c D k^2 per head",
                                lambda xl=xl, wl=wl, ksz=ksz: backends.definition("lisa_local_convolve")(
                                    xl, wl, (56, 56), (ksz, ksz)), tfn,
                                direct=direct("lisa_local_convolve", (xl, wl, (56, 56), (ksz, ksz)),
                                              ((1, 2, m, c, dd), dt))))
        # spectral product of Ga at 56x56 (rfft bins 56 x 29), c = 32, D = 16, 2 heads
        cdt = "complex128" if dt == "float64" else "complex64"
        nf = 56 * 29
        xf = (rng.standard_normal((2, nf, c)) + 1j * rng.standard_normal((2, nf, c))).astype(cdt)
        kf = (rng.standard_normal((nf, c, dd)) + 1j * rng.standard_normal((nf, c, dd))).astype(cdt)
        tfn = None
        if torch is not None:
            tx, tk = torch.from_numpy(xf), torch.from_numpy(kf)
            tfn = (lambda tx=tx, tk=tk: tx[..., None] * tk[None])
        out.append(Workload("op lisa_spectral_product 56x56 c=32 D=16 h=2", dt, 6 * 2 * nf * c * dd,
                            "6 real flops per complex product",
                            lambda xf=xf, kf=kf: backends.definition("lisa_spectral_product")(xf, kf), tfn,
                            direct=direct("lisa_spectral_product", (xf, kf), ((2, nf, c, dd), cdt))))
        # focused function f_p, p = 3, on (1, 3, N, 32)
        x = np.abs(rng.standard_normal((1, 3, n, 32))).astype(dt)
        tfn = None
        if torch is not None:
            tx = torch.from_numpy(x)

            def tfn(tx=tx):
                t = tx ** 3.0
                return tx.norm(dim=-1, keepdim=True) / t.norm(dim=-1, keepdim=True) * t
        out.append(Workload(f"op focused_function p=3 N={n} d=32 h=3", dt, None, "elementwise (no FLOP count)",
                            lambda x=x: backends.definition("focused_function")(x, 3.0), tfn,
                            direct=direct("focused_function", (x, 3.0), (x.shape, dt))))
        # angular series features, order 1 (d + d^3 + 1 features), Castling d = 8 heads-like rows
        xa = rng.standard_normal((1, 3, n // 4, 8)).astype(dt)
        dim = 1 + 8 + 8 ** 3
        tfn = None
        if torch is not None:
            txa = torch.from_numpy(xa)
            c1 = math.sqrt(1 / 6 / math.pi)
            c0 = math.sqrt(1 / math.pi)

            def tfn(txa=txa, c0=c0, c1=c1):
                xh = torch.nn.functional.normalize(txa, dim=-1)
                p3 = (xh[..., :, None, None] * xh[..., None, :, None] * xh[..., None, None, :]).flatten(-3)
                const = torch.full(xh.shape[:-1] + (1,), math.sqrt(0.5), dtype=xh.dtype)
                return torch.cat([const, c0 * xh, c1 * p3], dim=-1)
        out.append(Workload(f"op angular_series_features K=1 N={n // 4} d=8 h=3", dt, None,
                            "elementwise (no FLOP count)",
                            lambda xa=xa: backends.definition("angular_series_features")(xa, 1), tfn,
                            direct=direct("angular_series_features", (xa, 1), ((1, 3, n // 4, dim), dt))))
    return out


def workloads_softmax(np, torch, quick):
    """Global softmax attention (quadratic) for the scaling-exponent comparison only."""
    from refimpl.attention import softmax
    out = []
    for n in ((196, 784) if quick else (196, 784, 1568)):
        dt = "float64"
        q, k, v = qkv(np, 1, 3, n, 32, dt)
        tfn = None
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
            tfn = (lambda tq=tq, tk=tk, tv=tv: torch.softmax((tq * 32 ** -0.5) @ tk.transpose(-1, -2), dim=-1) @ tv)
        out.append(Workload(f"softmax attn N={n} d=32 h=3", dt, 3 * 4 * n * n * 32, "4 N^2 d per head",
                            lambda q=q, k=k, v=v: softmax.softmax_attention(q, k, v), tfn,
                            series="softmax (global) d=32", n=n))
    return out
