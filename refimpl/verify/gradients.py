"""Gradient verification (``--grad``): the foreign module's input gradient and parameter gradients for a random
cotangent, judged against the gradients of refimpl's float64 PyTorch twin of the reference.

Layer: the verify tool (torch; the twins of ``refimpl.twins.modules`` imported inside the functions, so that
verifying without ``--grad`` does not import them).  What happens (docs/verify.md, "Gradients"):

1. the twin of the reference (:data:`TWINS`) is built from the inferred configuration, cast to float64 and loaded
   with the mapped weights (the values the foreign module computes with, strictly: every key both ways);
2. its float64 forward on the same rounded input is judged against the NumPy reference with
   :func:`refimpl.verdict.compare` and the reference's float64 bound: only a twin that matches is used;
3. a cotangent g ~ N(0, 1) of the output's shape is drawn from ``seed`` and rounded to T; the foreign module
   (in T) and the twin (in float64) are differentiated with it: dL/dx and dL/dtheta for L = <g, y>; the foreign
   parameter gradients are read in the reference's keys by the same weight mapping as the weights
   (:func:`refimpl.verify.mapping.map_weights` on the gradients: slices of a fused projection, concatenations,
   reshapes);
4. each gradient tensor is judged by :func:`refimpl.verdict.compare` against :class:`GradientBound`: the last
   inner product that produces it (gamma_n of its length on the magnitudes of its terms, computed by autograd of
   the twin on absolute values; a broadcast leaf of another call, such as a norm's weight and bias, by the terms
   its backward sums, :func:`_broadcast_terms`) plus ``config.VERIFY_GRAD_BACKWARD_FACTOR`` times the forward's
   propagated relative bound on the same magnitudes; the ensemble is the twin's own gradient computed in T.

The output and the input's gradient are read through the reference's ``output_view`` / ``input_view`` (Swin's
pre-windowed layout: the windows merged into the unpadded grid).

Whole registered networks: :mod:`refimpl.verify.network_gradients` (the network's twin, its logits bound), which
judges its tensors with :func:`judge_tensors` as this module does.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable, Mapping

import numpy as np

from .. import config
from .. import verdict as _verdict
from ..numerics import round_to
from .loading import VerifyError
from .mapping import map_weights
from .report import _f
from .steps import _to64, _torch_dtype

__all__ = ["TWINS", "GradientBound", "verify_gradients", "forward_relative_bound", "judge_tensors"]


def _twin_focused(s: Any) -> tuple[Any, Callable]:
    from refimpl.twins.modules.focused import FocusedLinearAttention
    from .windows import WindowSetup, twin_focused_window
    if isinstance(s, WindowSetup):
        return twin_focused_window(s)
    sr = s.cfg.sr_ratio
    m = FocusedLinearAttention(s.cfg, (s.hw[0] // sr) * (s.hw[1] // sr))
    return m, lambda x: m(x, tuple(s.hw))


def _twin_enhanced(s: Any) -> tuple[Any, Callable]:
    from refimpl.twins.modules.enhanced import EnhancedLinearAttention
    m = EnhancedLinearAttention(s.cfg)
    return m, lambda x: m(x)


def _twin_rala(s: Any) -> tuple[Any, Callable]:
    """RALA's twin.  Channels-first: the twin as it is.  The reference's "tokens" layout (input tokens (B, N, C) or
    channels-last (B, H, W, C), nn.Linear weights): with the fused q, k, v and gate projection ("qkvo", the only
    projection the verifier infers) the twin has no forward in that layout (its channels-last branch runs the
    split "qkv" projections), so the channels-first twin of the same configuration computes it
    (:func:`_rala_tokens_twin`); with split projections, the twin's own channels-last forward."""
    import dataclasses as _dc

    from refimpl.twins.modules.rala import RALAttention
    cfg, (h, w) = s.cfg, tuple(s.hw)
    if cfg.layout == "channels_first":
        m = RALAttention(cfg)
        return m, lambda x: m(x)
    if cfg.gate_source == "qkvo":
        return _rala_tokens_twin(_dc.replace(cfg, layout="channels_first"), (h, w))
    m = RALAttention(cfg)
    return m, lambda x: m(x.reshape(x.shape[0], h, w, x.shape[-1])).reshape(x.shape)


def _rala_tokens_twin(cf_cfg: Any, hw: tuple[int, int]) -> tuple[Any, Callable]:
    """RALA in the reference's "tokens" layout with the fused "qkvo" projection, by the channels-first twin
    (``cf_cfg``: the same configuration, layout "channels_first"): the same mathematics (refimpl.attention.rala:
    ``_weight2d`` reads a 1 x 1 conv weight (out, in, 1, 1) and an nn.Linear one (out, in) as the same matrix; the
    keys are the same).  The twin's 1 x 1 convs "qkvo" and "proj" are replaced by nn.Linear modules of the tokens
    layout's shapes applied over the channel axis (F.linear on the channels-last view, so that the gradients'
    magnitudes see a multilinear use of each weight); the returned module registers the twin's submodules at their
    own names, so its parameters have the reference's keys and shapes.  The forward views x, (B, N, C) or
    (B, H, W, C), as (B, C, H, W) for the twin and its output back in x's shape (exact data movement).  The module
    is not a RALAttention: the ensemble records no teacher-forced stage tensors of it (they would be
    channels-first, the tested ones channels-last), only the whole module's members."""
    import torch
    import torch.nn.functional as F

    from refimpl.twins.modules.rala import RALAttention

    class _OverChannels(torch.nn.Linear):
        """nn.Linear (out, in) applied to the channel axis of (B, C, H, W): a 1 x 1 conv's map."""

        def forward(self, x):
            return F.linear(x.permute(0, 2, 3, 1), self.weight, self.bias).permute(0, 3, 1, 2)

    class RALAttentionOnTokens(torch.nn.Module):
        """The channels-first RALA twin on the tokens layout (:func:`refimpl.verify.gradients._rala_tokens_twin`)."""

        def __init__(self):
            super().__init__()
            twin = RALAttention(cf_cfg)
            c = cf_cfg.dim
            twin.qkvo = _OverChannels(c, 4 * c, bias=cf_cfg.qkv_bias)
            if cf_cfg.out_proj:
                twin.proj = _OverChannels(c, c, bias=True)
            for name, sub in twin.named_children():
                self.add_module(name, sub)
            object.__setattr__(self, "twin", twin)     # not registered: the parameters once, at the twin's names

        def forward(self, x):
            b, c, (h, w) = x.shape[0], x.shape[-1], hw
            y = self.twin(x.reshape(b, h, w, c).permute(0, 3, 1, 2))
            return y.permute(0, 2, 3, 1).reshape(x.shape)

    m = RALAttentionOnTokens()
    return m, lambda x: m(x)


def _twin_castling(s: Any) -> tuple[Any, Callable]:
    from refimpl.twins.modules.angular import CastlingAttention
    m = CastlingAttention(s.cfg)
    return m, lambda x: m(x, hw=tuple(s.hw))


def _twin_lisa(s: Any) -> tuple[Any, Callable]:
    from refimpl.twins.modules.lisa import from_config
    m = from_config(s.cfg)
    return m, lambda x: m(x)


def _twin_window(s: Any) -> tuple[Any, Callable]:
    from .windows import twin_softmax_window
    return twin_softmax_window(s)


#: reference name -> builder of its float64 PyTorch twin from a :class:`refimpl.verify.references.Setup`:
#: (module, forward on the reference's input layout; the shifted-window layouts: the twin between the layout's
#: own data movement, :mod:`.windows`)
TWINS: dict[str, Callable[[Any], tuple[Any, Callable]]] = {
    "softmax.window_attention": _twin_window, "flatten.attention": _twin_focused, "l2vit.attention": _twin_enhanced,
    "rala.attention": _twin_rala, "castling.attention": _twin_castling, "lisa.attention": _twin_lisa}


def _build_twin(name: str, s: Any, params: Mapping[str, np.ndarray]) -> tuple[Any, Callable]:
    """The twin of ``name`` in float64, eval mode, loaded strictly with ``params`` (reference keys)."""
    import torch
    if name not in TWINS:
        raise VerifyError(f"argument 'grad': no PyTorch twin is registered for the reference {name!r} (twins: "
                          f"{sorted(TWINS)})")
    m, fwd = TWINS[name](s)
    m = m.to(dtype=torch.float64).eval()
    sd = m.state_dict()
    want = {k for k, v in sd.items() if v.is_floating_point()}
    if want != set(params):
        raise VerifyError(f"argument 'grad': the twin of {name} has parameter keys {sorted(want)}, the reference "
                          f"{sorted(params)} (missing {sorted(set(params) - want)}, extra {sorted(want - set(params))})"
                          f": the twin cannot be loaded with the mapped weights")
    with torch.no_grad():
        for k, v in params.items():
            if tuple(sd[k].shape) != tuple(np.shape(v)):
                raise VerifyError(f"argument 'grad': the twin's {k!r} has shape {tuple(sd[k].shape)}, the "
                                  f"reference's {tuple(np.shape(v))}")
            sd[k].copy_(torch.from_numpy(np.asarray(v, dtype=np.float64)))
    return m, fwd


@dataclasses.dataclass(frozen=True)
class GradientBound(_verdict.Bound):
    """The bound of one gradient tensor: ``|err| <= (rho + f_k(u_T) + gamma_k(u_64)) scale + k (eta_T + eta_64)``.

    scale : ||M||_inf, the largest magnitude of the terms of the gradient's last inner product (autograd of the
        twin on absolute values: |A|^T |gbar| for a use z of a multilinear op; |dL/dz_use| for any other use;
        summed over the uses of z, so that uses whose contributions cancel are counted at their size).
    k : the length bound n of that inner product (the largest number of terms one gradient element sums:
        at most the number of elements of the op's output or of its other operands).
    rho : F_bwd (rho_fwd(T) + rho_fwd(float64)): the propagated part (the forward's intermediates and the
        backward ops upstream of the last one), relative to ``scale`` (docs/verify.md, "Gradients").
    f_k(u_T) : gamma_k, or with ``lam`` min(gamma_k, gamma~_k(lam)) (the last op is an inner product:
        Higham-Mary's model applies, :meth:`refimpl.verdict.Bound.factor`)."""

    rho: float = 0.0

    def array(self, dtype: Any, shape: tuple[int, ...], lam: float | None = None) -> np.ndarray:
        """The element-wise bound on a gradient of ``shape`` in T = ``dtype``: (rho + f_k(u_T) + gamma_k(u_64))
        scale + k (eta_T + eta_64), f_k = gamma_k, or min(gamma_k, gamma~_k(lam)) with ``lam``."""
        s = np.broadcast_to(np.asarray(self.scale, dtype=np.float64), shape)
        u = _verdict.unit_roundoff(dtype)
        f = _verdict.gamma(self.k, u)
        if lam is not None:
            f = min(f, _verdict.probabilistic_gamma(self.k, u, lam))
        g64 = _verdict.gamma(self.k, _verdict.unit_roundoff("float64"))
        eta = _verdict.underflow_eta(dtype) + _verdict.underflow_eta("float64")
        with np.errstate(over="ignore", invalid="ignore"):
            return (self.rho + f + g64) * s + self.k * eta


def forward_relative_bound(bound: Any, want: np.ndarray, dtype: str) -> float:
    """rho_fwd: the forward bound's largest element (deterministic factor) over the output's largest magnitude,
    max_i b_i / ||y||_inf; inf where the bound is not finite or the output is zero."""
    b = _verdict._nan_to_inf(bound.array(dtype, want.shape))
    top = float(np.max(np.abs(want), initial=0.0))
    if top == 0.0 or not np.all(np.isfinite(b)):
        return math.inf
    return float(np.max(b, initial=0.0)) / top


#: torch functions linear in each tensor argument: the magnitudes of their backward's terms are the backward of
#: the same function on absolute values (|A|^T |gbar|)
def _multilinear() -> set:
    import torch
    import torch.nn.functional as F
    T = torch.Tensor
    return {F.linear, F.conv1d, F.conv2d, F.conv3d, torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.mm,
            T.mm, torch.bmm, T.bmm, torch.einsum, torch.mul, T.mul, T.__mul__, T.__rmul__}


def _broadcast_terms(func: Callable, a2: Any, k2: Any, c: Any, gbar: Any) -> Any:
    """The magnitude of the terms a leaf's gradient sums over a broadcast in a call that is not multilinear (a
    norm's weight and bias, a table added to every sample): sum_j |a_j| |gbar_j| over the outputs j reading c_i,
    with a_j = d out_j / d c_i by forward mode (a tangent of ones; exact where each output reads one element of
    c) and the sum by the call's backward on |gbar| sign(a).  None where forward mode does not run the call."""
    import torch
    from torch.utils._pytree import tree_map

    def f(cc):
        return func(*tree_map(lambda a: cc if a is c else a, a2), **tree_map(lambda a: cc if a is c else a, k2))
    try:
        with torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)     # torch.func's own import-time notices
            base = c.detach()
            _, a = torch.func.jvp(f, (base,), (torch.ones_like(base),))
            leaf = base.clone().requires_grad_(True)
            m = torch.autograd.grad(f(leaf), leaf, gbar.abs() * torch.sign(a), allow_unused=True)[0]
    except Exception:       # a call forward mode does not support: the gradient's own magnitude stands
        return None
    return None if m is None else m.detach().abs()


def _magnitudes(fwd: Callable, x64: Any, named: dict[str, Any], g64: Any) -> tuple[dict[str, np.ndarray],
                                                                                  dict[str, float]]:
    """Per leaf (``named``: name -> tensor, the input and the twin's parameters): (M, n), M the magnitude of the
    terms of the leaf's gradient (the sum over its uses of each use's last op on absolute values), n the length
    bound of those ops' sums.  Each use of a leaf in a torch function is made a leaf of its own (a
    TorchFunctionMode), so that uses whose contributions cancel (a scale shared by the queries and keys) are
    counted at their own size."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves, tree_map

    ids = {id(t): name for name, t in named.items()}
    multi = _multilinear()
    uses: list[tuple[Any, tuple, dict, Any, list]] = []

    class _Uses(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            found: list[tuple[str, Any]] = []

            def sub(a):
                if isinstance(a, torch.Tensor) and id(a) in ids:
                    c = a.detach().requires_grad_(True)
                    found.append((ids[id(a)], c))
                    return c
                return a
            a2, k2 = tree_map(sub, args), tree_map(sub, kwargs)
            out = func(*a2, **k2)
            if found:
                uses.append((func, a2, k2, out, found))
            return out

    with torch.enable_grad():
        with _Uses():
            y = fwd(x64)
        y = y[0] if isinstance(y, (tuple, list)) else y
        live = [(i, j) for i, u in enumerate(uses) for j, (_, c) in enumerate(u[4]) if c.requires_grad]
        # the calls whose output cotangent is needed: multilinear ones, and those reducing a leaf's gradient over
        # a broadcast (a norm's weight and bias, an added table)
        outs = [i for i, u in enumerate(uses) if isinstance(u[3], torch.Tensor) and u[3].requires_grad and (
            u[0] in multi or any(c.numel() < u[3].numel() for _, c in u[4]))]
        if not live or not y.requires_grad:
            return {}, {}
        grads = torch.autograd.grad(y, [uses[i][4][j][1] for i, j in live] + [uses[i][3] for i in outs], g64,
                                    allow_unused=True)
    g_use = {key: g for key, g in zip(live, grads[:len(live)])}
    g_out = {i: g for i, g in zip(outs, grads[len(live):])}
    mag: dict[str, np.ndarray] = {}
    length: dict[str, float] = {}
    for i, (func, a2, k2, out, found) in enumerate(uses):
        for j, (name, c) in enumerate(found):
            g = g_use.get((i, j))
            if g is None:
                continue
            m = None
            others = [t.numel() for t in tree_leaves((a2, k2)) if isinstance(t, torch.Tensor) and t is not c]
            n = max([out.numel() if isinstance(out, torch.Tensor) else c.numel()] + others)
            if i in g_out and g_out[i] is not None and func not in multi:
                if c.numel() < out.numel():
                    m = _broadcast_terms(func, a2, k2, c, g_out[i])
                    m = None if m is None else torch.maximum(m, g.detach().abs())
            elif i in g_out and g_out[i] is not None:
                def absed(a, c=c):
                    if a is c:
                        return c_abs
                    return a.detach().abs() if isinstance(a, torch.Tensor) else a
                with torch.enable_grad():
                    c_abs = c.detach().abs().requires_grad_(True)
                    ya = func(*tree_map(absed, a2), **tree_map(absed, k2))
                    m = torch.autograd.grad(ya, c_abs, g_out[i].abs(), allow_unused=True)[0]
            m = (g if m is None else m).detach().abs()
            mag[name] = mag[name] + _to64(m) if name in mag else _to64(m)
            length[name] = max(length.get(name, 1.0), float(n))
    return mag, length


def backward_pass(module: Any, forward: Callable[[Any], Any], x: np.ndarray, g: np.ndarray, dtype: str,
                  device: str, who: str, expected: str, *, reshape: bool = False) -> tuple[Any, Any, np.ndarray,
                                                                                        dict[str, np.ndarray]]:
    """(x and the output y as the torch tensors of the pass, dL/dx, dL/dtheta in the module's parameter names) of
    ``forward(x)``
    (the module's forward on a tensor) in ``dtype`` for L = <g, y>: every floating parameter made to require a
    gradient for the run and restored after it, gradients cleared.  The output must have g's shape (``reshape``:
    g's number of elements, g reshaped to it); ``who`` and ``expected`` word the error.  Shared by the layer, the
    network and the unit-wise gradients (hooks a caller registers on the module see this one pass)."""
    import torch
    asked = _torch_dtype(dtype)
    params = dict(module.named_parameters(remove_duplicate=False))
    frozen = {k for k, p in params.items() if not p.requires_grad}
    xt = torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=asked).requires_grad_(True)
    gt = torch.from_numpy(g).to(device=device, dtype=asked)
    try:
        for p in params.values():
            if p.is_floating_point():
                p.requires_grad_(True)
                p.grad = None
        with torch.enable_grad():
            out = forward(xt)
            out = out[0] if isinstance(out, (tuple, list)) else out
            if (out.numel() != g.size) if reshape else (tuple(out.shape) != tuple(g.shape)):
                raise VerifyError(f"argument 'grad': {who}'s output has shape {tuple(out.shape)} in the gradient "
                                  f"run, {expected}")
            out.backward(gt.reshape(out.shape) if reshape else gt)
    except VerifyError:
        raise
    except Exception as exc:
        raise VerifyError(f"argument 'grad': {who}'s forward or backward raised {type(exc).__name__}: {exc}"
                          ) from exc
    finally:
        for k in frozen:
            params[k].requires_grad_(False)
    dx = _to64(xt.grad) if xt.grad is not None else np.zeros(x.shape)
    grads = {k: (_to64(p.grad) if p.grad is not None else np.zeros(tuple(p.shape))) for k, p in params.items()
             if p.is_floating_point()}
    for p in params.values():
        p.grad = None
    return xt, out, dx, grads


def _foreign_gradients(module: Any, x: np.ndarray, ref: Any, s: Any, call: Any, g: np.ndarray, dtype: str,
                       device: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """dL/dx and dL/dtheta (foreign keys) of the foreign module in ``dtype`` for L = <g, y>."""
    import torch
    args, kwargs = ref.call(s, call)
    # arrays the reference passes to the forward (Swin's shift mask for pre-windowed input): in the asked dtype
    kwargs = {k: torch.from_numpy(v).to(device=device, dtype=_torch_dtype(dtype)) if isinstance(v, np.ndarray) else v
              for k, v in kwargs.items()}

    def forward(xt):
        y = module(xt, *args, **kwargs)
        return ref.output_view(s, y[0] if isinstance(y, (tuple, list)) else y)
    _, _, dx, grads = backward_pass(module, forward, x, g, dtype, device, "the module",
                                    f"{tuple(g.shape)} in the forward run")
    return dx, grads


def _twin_in(name: str, s: Any, params: Mapping[str, np.ndarray], x: np.ndarray, g: np.ndarray, dtype: str,
             names: list[str]) -> dict[str, np.ndarray] | None:
    """The twin's gradients computed in ``dtype`` (a legitimate evaluation for the ensemble: the parameters are
    the foreign module's, exact in ``dtype``), or None where the twin does not run in that precision."""
    import torch
    asked = _torch_dtype(dtype)
    try:
        m, fwd = _build_twin(name, s, params)
        m = m.to(dtype=asked)
        tp = dict(m.named_parameters())
        xt = torch.from_numpy(x).to(dtype=asked).requires_grad_(True)
        with torch.enable_grad():
            y = fwd(xt)
            y = y[0] if isinstance(y, (tuple, list)) else y
            gr = torch.autograd.grad(y, [xt] + [tp[k] for k in names[1:]], torch.from_numpy(g).to(dtype=asked),
                                     allow_unused=True)
    except Exception:       # a twin op without a kernel in this precision (a half-precision FFT on the CPU)
        return None
    return {k: (_to64(t) if t is not None else np.zeros(x.shape if k == "input" else tuple(tp[k].shape)))
            for k, t in zip(names, gr)}


def judge_tensors(section: dict[str, Any], names: list[str], refg: Mapping[str, np.ndarray],
                  got: Mapping[str, np.ndarray], source: Mapping[str, str], mag: Mapping[str, np.ndarray],
                  length: Mapping[str, float], member: Mapping[str, np.ndarray] | None, rho: float, dtype: str,
                  p_false_alarm: float, none: Mapping[str, str]) -> None:
    """Judge each gradient tensor (``names``: "input", then reference keys) of the foreign module (``got``, in the
    reference's keys and shapes where sizes agree) against the twin's float64 gradient (``refg``) with a
    :class:`GradientBound` (``mag`` / ``length`` from :func:`_magnitudes`, ``rho`` the propagated part) and the
    twin's gradient in ``dtype`` as the ensemble (``member``; None: no member); fill ``section``'s "tensors",
    "verdict" and "first_divergence".  ``none``: reference key -> why it has no foreign gradient ("not
    compared"); ``source``: reference key -> the foreign tensor it was read from."""
    p_each = p_false_alarm / max(len(names), 1)
    verdicts = []
    for k in names:
        r = refg[k]
        a = got[k]
        where = "input" if k == "input" else source.get(k, "")
        if k in none:
            section["tensors"].append({"name": k, "foreign": where, "verdict": "not compared", "ok": False,
                                       "max_abs_err": None, "max_rel_err": None, "bound": None,
                                       "err_over_bound": None, "detail": none[k]})
            continue
        if a.shape != r.shape:
            a = a.reshape(r.shape) if a.size == r.size else a
        m_top = float(np.max(np.maximum(mag.get(k, np.abs(r)), np.abs(r)), initial=0.0))
        bound = GradientBound(np.float64(m_top), max(length.get(k, 1.0), 1.0),
                              f"gradient of {k}: last inner product on magnitudes + F_bwd x forward bound",
                              accumulation=True, rho=rho)
        ens = None if member is None else {f"twin in {dtype}": member[k]}
        rep = _verdict.compare(a, r, bound, dtype, ensemble=ens, name=f"d/d {k}", p_false_alarm=p_each)
        verdicts.append(rep.verdict)
        bnd = float(np.max(_verdict._nan_to_inf(bound.array(dtype, r.shape)), initial=0.0))
        section["tensors"].append({
            "name": k, "foreign": where, "verdict": rep.verdict, "ok": rep.verdict == _verdict.MATCH,
            "max_abs_err": _f(np.max(np.abs(a - r), initial=0.0)), "max_rel_err": _f(rep.rel_err),
            "bound": _f(bnd), "err_over_bound": _f(rep.max_err_over_bound),
            "detail": "" if rep.verdict == _verdict.MATCH else "; ".join(rep.reasons)})
    section["verdict"] = (_verdict.DIVERGES if _verdict.DIVERGES in verdicts else
                          _verdict.MATCH if verdicts and all(v == _verdict.MATCH for v in verdicts) else
                          _verdict.INCONCLUSIVE)
    first = next((t for t in section["tensors"] if t["verdict"] == _verdict.DIVERGES), None)
    section["first_divergence"] = None if first is None else {
        "tensor": first["name"], "why": first["detail"], "max_abs_err": first["max_abs_err"],
        "err_over_bound": first["err_over_bound"]}


def verify_gradients(module: Any, x: np.ndarray, ref: Any, s: Any, wm: Any, state: Mapping[str, np.ndarray],
                     user_map: Any, call: Any, dtype: str, device: str, seed: int, want: np.ndarray,
                     fwd_bound: Any, p_false_alarm: float) -> dict[str, Any]:
    """The report's ``gradients`` section (docs/verify.md): the twin's forward check, the cotangent, one entry
    per gradient tensor (the input and each reference parameter) and the gradients' verdict."""
    import torch
    params = wm.values
    twin, fwd = _build_twin(ref.name, s, params)
    x64 = torch.from_numpy(np.ascontiguousarray(x))
    with torch.no_grad():
        y64 = fwd(x64)
    y64 = _to64(y64[0] if isinstance(y64, (tuple, list)) else y64)
    b64 = ref.bound(x, params, s, "float64")
    tw = _verdict.compare(y64, want, b64, "float64", name="twin forward")
    section: dict[str, Any] = {
        "twin": type(twin).__module__ + "." + type(twin).__name__,
        "twin_forward": {"verdict": tw.verdict, "err_over_bound": _f(tw.max_err_over_bound),
                         "max_abs_err": _f(tw.max_abs_err), "reasons": list(tw.reasons)},
        "cotangent": f"N(0, 1) of shape {list(want.shape)} from seed {seed} (stream 1), rounded to {dtype}",
        "backward_factor": config.VERIFY_GRAD_BACKWARD_FACTOR, "tensors": []}
    if tw.verdict != _verdict.MATCH:
        section["verdict"] = _verdict.INCONCLUSIVE
        section["why"] = (f"the float64 PyTorch twin ({section['twin']}) does not match the NumPy reference "
                          f"({tw.verdict}: {'; '.join(tw.reasons)}): its gradients cannot serve as the reference; "
                          f"no gradient was compared")
        return section
    rng = np.random.default_rng([int(seed), 1])
    g = round_to(rng.standard_normal(want.shape), dtype)
    dx, fgrads = _foreign_gradients(module, x, ref, s, call, g, dtype, device)
    # the foreign gradients in the reference's keys: the weights' mapping applied to the gradients (buffers set to
    # NaN: a reference key filled from a buffer has no gradient to compare)
    gstate = {k: (fgrads[k] if k in fgrads else (np.full(np.shape(v), np.nan) if np.issubdtype(
        np.asarray(v).dtype, np.floating) else v)) for k, v in state.items()}
    gm = map_weights(gstate, s.shapes, aliases=ref.aliases, fused=ref.fused, joined=ref.joined, user_map=user_map,
                     buffers=[k for k, _ in module.named_buffers()])
    # the twin's float64 gradients, and the magnitudes of their terms
    tp = dict(twin.named_parameters())
    names = ["input"] + sorted(params)
    xg = x64.clone().requires_grad_(True)
    g64 = torch.from_numpy(g)
    with torch.enable_grad():
        y = fwd(xg)
        y = y[0] if isinstance(y, (tuple, list)) else y
        rg = torch.autograd.grad(y, [xg] + [tp[k] for k in names[1:]], g64, allow_unused=True)
    refg = {k: (_to64(t) if t is not None else np.zeros(x.shape if k == "input" else tuple(tp[k].shape)))
            for k, t in zip(names, rg)}
    mag, length = _magnitudes(fwd, x64, {"input": x64, **{k: tp[k] for k in names[1:]}}, g64)
    member = None if dtype == "float64" else _twin_in(ref.name, s, params, x, g, dtype, names)
    rho = config.VERIFY_GRAD_BACKWARD_FACTOR * (forward_relative_bound(fwd_bound, want, dtype) +
                                                forward_relative_bound(b64, want, "float64"))
    section["forward_relative_bound"] = _f(rho / config.VERIFY_GRAD_BACKWARD_FACTOR)
    # the input's gradient as the reference's input (the pre-windowed layout: the grid without Swin's padding)
    dx, refg["input"] = ref.input_view(s, dx), ref.input_view(s, refg["input"])
    if "input" in mag:
        mag["input"] = ref.input_view(s, mag["input"])
    if member is not None:
        member["input"] = ref.input_view(s, member["input"])
    got = {"input": dx, **gm.values}
    # the keys read from a buffer: NaN in the same mapping of zero gradients (a NaN gradient the module computed
    # is compared, not taken for a buffer)
    zstate = {k: (np.zeros(np.shape(v)) if k in fgrads else v) for k, v in gstate.items()}
    zm = map_weights(zstate, s.shapes, aliases=ref.aliases, fused=ref.fused, joined=ref.joined, user_map=user_map,
                     buffers=[k for k, _ in module.named_buffers()])
    none = {k: "filled from a buffer of the module: no gradient" for k in names[1:]
            if np.any(np.isnan(zm.values[k]))}
    judge_tensors(section, names, refg, got, {k: gm.source.get(k, "") for k in names[1:]}, mag, length, member,
                  rho, dtype, p_false_alarm, none)
    return section
