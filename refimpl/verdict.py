"""The verdict: how a tested output is judged against the float64 reference.

Layer: beside :mod:`refimpl.numerics` (imports only :mod:`refimpl.config` and :mod:`refimpl.verdict_bounds`, the
arithmetic of the bounds: unit roundoffs, ``gamma_k``, the mixed-precision counts, :class:`Bound`, whose public
names are re-exported here, their documented home); numerics re-exports the names below, so
``numerics.compare`` and ``verdict.compare`` are the same function.  This file: the report, :func:`compare`,
:func:`assert_close`, :func:`assert_no_divergence`, and the stage-wise comparison (:class:`Stage`,
:func:`compare_stages`).

A comparison has three outcomes (``ErrorReport.verdict``):

``"diverges"``
    the NaN/Inf patterns differ, or some element is outside its bound, or the tested output is less
    accurate than every legitimate evaluation of the same computation by more than a calibrated factor
    (the *ensemble criterion*, below).  Each of these is evidence of a defect.
``"inconclusive"``
    nothing diverged, but the bound cannot tell a correct result from a wrong one: it is not finite at some
    element, or it reaches the size of the quantity itself (relative bound >= 1, defined below).  The
    report says what would make the check conclusive.  Tests and the verifier treat it as not passing.
``"match"``
    everything else.

**Two bounds per element** (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., ch. 3; Higham
and Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019).  A
:class:`Bound` carries the magnitude ``S`` (the computation on absolute values) and the depth ``k``.  Then

- the deterministic worst case is ``|err| <= gamma_k(u) S`` with ``gamma_k(u) = k u / (1 - k u)``; it is
  infinite once ``k u >= 1`` (k = 3526 in float16 already);
- the probabilistic bound (Higham-Mary Theorem 2.4, as used in their Theorem 3.1 for inner products) replaces
  ``gamma_k`` by ``gamma~_k(lam) = exp(lam sqrt(k) u + k u^2 / (1 - u)) - 1``, which holds for one product
  of k rounding factors with probability at least ``1 - 2 exp(-lam^2 (1 - u)^2 / 2)`` when the rounding errors
  are independent and mean-zero.  It grows like ``sqrt(k) u`` and is finite for every k.

The verdict uses ``min(gamma_k, gamma~_k(lam))`` (both hold, so the minimum holds with the probabilistic
bound's probability) and reports both.  ``lam`` is chosen per comparison by a union bound over every rounding
factor it involves: ``n_elements * k`` of them, so that the probability of a false alarm on a correct
computation is at most ``p`` (``config.VERDICT_FALSE_ALARM`` = 1e-6, split across stages by the caller):

    lam = sqrt(2 log(2 n_elements k / p)) / (1 - u).

The float64 reference's own error is added with the deterministic ``gamma_k(u_64)`` (it is tiny).

**Composite bounds** (a module's running first-order bound, :func:`running_bound`) chain many stages; the
worst case there is ``u E`` with ``E >= sum_r |c_r|`` over every rounding r of the computation.  Where a module
also computes the l2 coefficient ``sigma >= sqrt(sum_r c_r^2)`` (:attr:`Bound.sigma`: each n-term sum counts
``sqrt(n)`` instead of ``n``, and stages or tokens whose roundings are disjoint add in quadrature), the same
model gives ``|err_i| <= lam u sigma_i`` per element with probability at least ``1 - 2 exp(-lam^2 / 2)``
(Azuma-Hoeffding, the tool of Higham-Mary's proofs), and the verdict uses ``min(gamma_K u E, lam u sigma)``,
``lam`` from a union bound over the elements.  FLatten-PVT's 4097-term reduction convolution makes ``u E``
23 times the output in float32 at 56 x 56; ``lam u sigma`` is 0.09 of it (docs/verdict.md).  RALA's whole layer
(official, 56 x 56): ``u E`` is 5 times the output in float16 and infinite in bfloat16, ``lam u sigma`` a fraction
of it (docs/verdict.md; :func:`sum_rounding_l2` charges a sum's rounding into T at |s|).

**Relative bound.**  Element i's bound ``b_i`` is compared with the size of the quantity,
``max(|ref_i|, rms(ref), eta_T / u_T)``: an element whose reference is near zero by cancellation is measured
against the tensor's typical size, not against its own (which would make every bound void there, in any
precision); and a quantity below T's normal range (eta_T / u_T is of the order of T's smallest normal number) is
measured against that floor, where T resolves only absolute differences of eta_T whatever the algorithm (an
elu1 feature exp(-277) = 5e-122 is 0 in float32, and its bound k eta_T cannot be relatively small).  A
reference that is exactly zero everywhere has no size: there any finite bound is conclusive (the tested output
must reproduce the zeros to within it).

**The ensemble criterion** replaces the former "at most 2x the naive NumPy error" rule, which compared two
single samples of rounding error and failed legitimate algorithms (cuDNN/oneDNN convolutions, other GEMM
blockings) by 2-4x.  An *ensemble* of legitimate evaluations of the same computation in the same precision
(the NumPy definition run in T, and other summation orders, convolution algorithms, thread counts and library
settings: :mod:`refimpl.ensemble` builds them for torch code) gives the errors a correct implementation
actually makes.  With ``z_i = |x_i - ref_i| / w_i``, ``w_i = S_i + eta_T / u_T`` (error in units of the element's
magnitude, the quantity its rounding errors scale with, so that small elements count as much as large ones; a
rounding errs by ``u_T (|x| + eta_T / u_T)``, so below T's normal range the floor ``eta_T / u_T`` is that magnitude;
where S_i is not finite the bound's l2 coefficient sigma_i stands in, and where that is absent or not finite
``max(|ref_i|, rms(ref))``: finite even where the bound is not) and for each evaluation x the two statistics

    zmax(x) = max_i z_i,        zrms(x) = sqrt(mean_i z_i^2),

the tested output must satisfy ``zmax <= VERDICT_MAX_FACTOR * max_m zmax(m)`` and
``zrms <= VERDICT_RMS_FACTOR * max_m zrms(m)`` over the ensemble members m (the RMS condition from
``config.VERDICT_RMS_MIN_ELEMENTS`` compared elements on, below which the mean square of one algorithm's errors
is too noisy a statistic: see that constant's derivation).  The maximum catches a defect
confined to a few elements (a boundary row, one batch item); the RMS, which averages over the whole output and
so varies little between legitimate algorithms, catches a small defect spread over every element (a scale
applied twice at a small magnitude).  One member is always present: the output's own final rounding,
``u_T |ref_i| + eta_T`` (Higham eq. 2.8: eta_T is the quantum of T's subnormal range), which no implementation
in T can avoid; it keeps the criterion from collapsing to "error 0"
when every other member happens to be exact.  A member equal to the tested output bit for bit (a variant that
did not change the arithmetic) is dropped: it is the tested algorithm again and would make the criterion unable
to fail.  With fewer than two legitimate evaluations left (the kernel-agreement tests, which have only the
NumPy naive run; members equal to each other bit for bit count once), the random-rounding model's typical
accumulated error
``sqrt(k) u_T S_i`` (the typical size of the bound's own worst case ``k u_T S_i``; S carries the
conditioning, |ref_i| would not; where the bound knows the l2 coefficient of each element's roundings,
:attr:`Bound.typical`, ``u_T typical_i`` instead, and the z units are ``typical_i + eta_T / u_T``) joins too, as it does when the ensemble holds fewer than
``config.VERDICT_RMS_MIN_ELEMENTS`` compared errors in all (elements times members: a two-element output): one
sample of another algorithm's error on a handful of elements is no measure of a third algorithm's.  The two
factors are calibrated in ``benchmarks/verdict.py`` (docs/verdict.md: the largest ratio of one legitimate
algorithm's statistic to the maximum of the others', measured over every module and precision, times a stated
margin).  In float64 itself, where the reference is no more accurate than the tested code and every error is
measured against it, the reference's own typical error ``sqrt(k) u_64 S_i`` is always a member (a float64 GEMM
blocked otherwise than every re-run variant, MKL on an Intel CPU, was called "diverging").

When no ensemble is given (kernel-agreement tests in float64, where the naive computation is the reference
itself), the verdict rests on the bound alone and says so in the report.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import config
# The arithmetic of the bounds (unit roundoffs, gamma_k, the mixed-precision counts, Bound) lives in
# refimpl.verdict_bounds; its names are public here, their documented home (and _FORMATS, format_name for the
# comparison below).
from .verdict_bounds import (_FORMATS, Bound, accumulation_format, accumulation_ratio, confidence_lambda,  # noqa: F401
                             format_name, gamma, probabilistic_gamma, round_to, running_bound, sum_depth, sum_depth_l2,
                             sum_rounding_l2, ulp_distance, underflow_eta, unit_roundoff)

__all__ = [
    "unit_roundoff", "underflow_eta", "accumulation_format", "accumulation_ratio", "sum_depth", "sum_depth_l2",
    "sum_rounding_l2", "running_bound", "gamma", "probabilistic_gamma", "confidence_lambda", "round_to", "Bound",
    "ulp_distance", "ErrorReport", "compare", "assert_close", "assert_no_divergence", "MATCH", "DIVERGES",
    "INCONCLUSIVE", "Stage", "StageReport", "compare_stages",
]

MATCH, DIVERGES, INCONCLUSIVE = "match", "diverges", "inconclusive"

# ===================================================================================================
# The report
# ===================================================================================================

@dataclasses.dataclass
class ErrorReport:
    """What :func:`compare` measured.  ``verdict`` is the outcome, ``ok`` is ``verdict == "match"``;
    ``str(report)`` explains it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    verdict: str
    reasons: list[str]
    k: float
    note: str
    lam: float
    p_false_alarm: float
    max_abs_err: float
    max_err_over_bound: float          # against the verdict's (probabilistic) bound
    max_err_over_worst_case: float     # against the deterministic gamma_k bound
    max_relative_bound: float          # max_i b_i / max(|ref_i|, rms(ref)); >= 1 is void
    worst_index: tuple[int, ...] | None
    worst_actual: float
    worst_reference: float
    worst_bound: float
    worst_case_bound: float
    ulp_at_worst: float
    max_ulp: float
    rel_err: float                     # ||actual - ref||_F / ||ref||_F over the finite slots
    zmax: float
    zrms: float
    ensemble: dict[str, tuple[float, float]]  # member -> (zmax, zrms)
    zmax_threshold: float
    zrms_threshold: float
    pattern_ok: bool
    pattern_msg: str
    beyond_range: int = 0              # slots excused as beyond T's range (the only reason when "inconclusive")

    @property
    def ok(self) -> bool:
        """Whether the verdict is "match"."""
        return self.verdict == MATCH

    @property
    def within_bound(self) -> bool:
        """Whether the largest error is within the verdict's (probabilistic) bound: max err / bound <= 1."""
        return self.max_err_over_bound <= 1.0

    @property
    def ensemble_ok(self) -> bool:
        """Whether the ensemble criterion holds: zmax and zrms within their thresholds."""
        return self.zmax <= self.zmax_threshold and self.zrms <= self.zrms_threshold

    def __str__(self) -> str:
        """The explanation: the verdict and its reasons, the error against the probabilistic and the worst-case bound,
        the worst element, the ensemble criterion and the NaN/Inf pattern."""
        lines = [
            f"{self.name}: {self.verdict.upper()}; shape {self.shape}, tested dtype {self.dtype}, k = {self.k:g}"
            f" ({self.note})",
        ]
        lines += [f"  - {r}" for r in self.reasons]
        lines += [
            f"  max |err| = {self.max_abs_err:.3e} (relative, Frobenius: {self.rel_err:.3e});"
            f" err/bound = {self.max_err_over_bound:.3g} (probabilistic, lam = {self.lam:.3g},"
            f" P(false alarm) <= {self.p_false_alarm:.1e}), {self.max_err_over_worst_case:.3g} (worst case);"
            f" largest relative bound {self.max_relative_bound:.3g}",
            f"  worst index {self.worst_index}: actual {self.worst_actual!r}, reference {self.worst_reference!r},"
            f" bound {self.worst_bound:.3e} (worst case {self.worst_case_bound:.3e}), {self.ulp_at_worst:.3g} ulp"
            f" (max {self.max_ulp:.3g} ulp)",
            f"  ensemble criterion: zmax {self.zmax:.3g} <= {self.zmax_threshold:.3g}, zrms {self.zrms:.3g} <="
            f" {self.zrms_threshold:.3g} {'ok' if self.ensemble_ok else 'FAIL'}; members (zmax, zrms): "
            + ", ".join(f"{m} ({a:.3g}, {b:.3g})" for m, (a, b) in self.ensemble.items()),
            f"  NaN/Inf pattern: {self.pattern_msg}",
        ]
        return "\n".join(lines)


def _pattern(actual: np.ndarray, reference: np.ndarray) -> tuple[bool, str]:
    an, rn = np.isnan(actual), np.isnan(reference)
    if not np.array_equal(an, rn):
        bad = np.argwhere(an != rn)[0]
        return False, (f"NaN positions differ ({int(an.sum())} in actual, {int(rn.sum())} in reference);"
                       f" first at {tuple(int(i) for i in bad)}: actual {actual[tuple(bad)]!r},"
                       f" reference {reference[tuple(bad)]!r}")
    ai, ri = np.isinf(actual), np.isinf(reference)
    if not np.array_equal(ai, ri) or not np.array_equal(np.sign(actual[ai]), np.sign(reference[ri])):
        bad = np.argwhere((ai != ri) | (ai & ri & (np.sign(actual) != np.sign(reference))))[0]
        return False, (f"Inf positions or signs differ; first at {tuple(int(i) for i in bad)}: actual"
                       f" {actual[tuple(bad)]!r}, reference {reference[tuple(bad)]!r}")
    return True, f"agree ({int(an.sum())} NaN, {int(ai.sum())} Inf)"


def _z_stats(err: np.ndarray, bnd: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """(max, rms) of err / bnd over ``mask`` (0 where err is 0; +inf where err > 0 meets a zero weight)."""
    if not mask.any():
        return 0.0, 0.0
    e, b = err[mask], bnd[mask]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = np.where(e > 0, e / b, 0.0)
    z = np.where(np.isnan(z), np.inf, z)
    with np.errstate(over="ignore"):
        return float(z.max()), float(np.sqrt(np.mean(z * z)))


def _nan_to_inf(b: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(b), np.inf, b)


def _rms(a: np.ndarray) -> float:
    """sqrt(mean(a^2)) without overflow or underflow of the squares (scaled by max |a|); 0 for no entries,
    inf if an entry is inf."""
    a = np.abs(np.asarray(a, dtype=np.float64))
    if a.size == 0:
        return 0.0
    m = float(a.max())
    if m == 0.0 or not math.isfinite(m):
        return m
    return m * float(np.sqrt(np.mean((a / m) ** 2)))


def _weights(bound: Bound, ref: np.ndarray, finite: np.ndarray, dtype_name: str) -> np.ndarray:
    """w_i = S_i + eta_T / u_T: the magnitude each element's rounding errors scale with (in units of u_T, as S: a
    rounding errs by u_T |x| + eta_T = u_T (|x| + eta_T / u_T), Higham eq. 2.8, so below T's normal range the
    floor eta_T / u_T, of the order of T's smallest normal number, is what an element's error scales with).  Where S is not finite (a
    coefficient that overflowed, or a depth K whose gamma_K(u_T) is void), the bound's l2 coefficient sigma_i
    stands in where it is finite (the magnitude the probabilistic bound lam u_T sigma_i itself scales with), and
    the size of the quantity max(|ref_i|, rms(ref)) where neither is.  A bound that knows each element's typical
    error (:attr:`Bound.typical`, the l2 coefficient of its roundings) is measured in that unit instead, where it
    is finite and positive: it is the magnitude the element's rounding errors actually scale with, where the
    elements of one output carry different roundings (S_i, the l1 count over K, spreads them evenly)."""
    s = np.broadcast_to(np.asarray(bound.scale, dtype=np.float64), ref.shape)
    if bound.typical is not None:
        typ = np.abs(np.broadcast_to(np.asarray(bound.typical, dtype=np.float64), ref.shape))
        with np.errstate(invalid="ignore"):
            s = np.where(np.isfinite(typ) & (typ > 0), typ, s)
    size = np.maximum(np.abs(ref), _rms(ref[finite]))
    if bound.sigma is not None:
        sig = np.abs(np.broadcast_to(np.asarray(bound.sigma, dtype=np.float64), ref.shape))
        with np.errstate(invalid="ignore"):
            size = np.where(np.isfinite(sig), sig, size)
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(s), np.abs(s), size) + underflow_eta(dtype_name) / unit_roundoff(dtype_name)


def compare(actual: Any, reference: Any, bound: Bound, dtype: Any, *, naive: Any = None,
            ensemble: Mapping[str, Any] | None = None, name: str = "output",
            p_false_alarm: float | None = None) -> ErrorReport:
    """Compare a tested output with the float64 reference: the verdict of the module docstring.

    Parameters
    ----------
    actual : array (any float dtype or a torch tensor), the tested implementation's output, computed in T.
    reference : float64 array of the same shape, the refimpl output on the same (T-rounded) inputs.
    bound : :class:`Bound` for this operation (scale S and depth k).
    dtype : T, the precision the tested code computed in ("float32", np.float32, torch.float32, ...).
    naive : optional array, the NumPy definition run in T (:func:`refimpl.numerics.naive_same_precision`):
        one member of the ensemble, and a judge of precision-excused non-finite slots (below).
    ensemble : optional mapping name -> array of further legitimate evaluations in T
        (:func:`refimpl.ensemble.legitimate_runs`); judges of those slots too.
    p_false_alarm : the probability budget of this comparison (default ``config.VERDICT_FALSE_ALARM``);
        a caller comparing several stages passes its share.

    Non-finite slots: the NaN/Inf patterns must agree exactly; the one exception is a slot where a legitimate
    evaluation in T (the naive run, or an ensemble member other than the tested arithmetic again) is itself
    non-finite while the reference is finite (T cannot represent that result by that evaluation: float16
    overflow, or a direct float64 evaluation whose subnormal products underflow to 0/0 where the reference
    rescales), which the tested code may match: such slots are not divergences, but they cannot be checked
    either, so the verdict is at best "inconclusive" (``beyond_range`` counts them when that is the only reason;
    a port whose float16 output overflows is not shown correct by it).
    """
    act = _to_numpy64(actual)
    ref = _to_numpy64(reference)
    if act.shape != ref.shape:
        raise AssertionError(f"{name}: shape mismatch, actual {act.shape} vs reference {ref.shape}")
    dname = format_name(dtype)
    u = unit_roundoff(dname)
    p = config.VERDICT_FALSE_ALARM if p_false_alarm is None else float(p_false_alarm)
    members: dict[str, np.ndarray] = {}
    if naive is not None:
        members["numpy naive"] = _to_numpy64(naive)
    for key, val in (ensemble or {}).items():
        members[str(key)] = _to_numpy64(val)
    for key, val in members.items():
        if val.shape != ref.shape:
            raise AssertionError(f"{name}: ensemble member {key!r} has shape {val.shape}, reference {ref.shape}")
    # A member equal to the tested output bit for bit ran the tested arithmetic again: it says nothing about
    # what another algorithm would do (and would make the criterion unable to fail), so it is dropped.
    same = [key for key, val in members.items() if key != "numpy naive" and np.array_equal(val, act, equal_nan=True)]
    for key in same:
        del members[key]
    # A slot is beyond T's range where the tested code and a legitimate evaluation in T (the naive run, or an
    # ensemble member that is not the tested arithmetic again) are both non-finite and the reference is finite:
    # a direct evaluation that underflows to 0/0 or overflows there (the reference may rescale and be exact).
    beyond = np.zeros(ref.shape, dtype=bool)
    for val in members.values():
        beyond |= ~np.isfinite(val)
    excused = np.isfinite(ref) & beyond & ~np.isfinite(act)
    pattern_ok, pattern_msg = _pattern(np.where(excused, ref, act), ref)
    if excused.any():
        pattern_msg += (f"; {int(excused.sum())} slot(s) non-finite in the tested code where a legitimate"
                        f" {dname} evaluation is non-finite too (beyond {dname}'s range; excused)")
    finite = np.isfinite(act) & np.isfinite(ref)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(finite, np.abs(act - ref), 0.0)

    # The union bound counts the probabilistic statements the bound makes: one per rounding factor product
    # (n_elements * k) for an accumulation bound, one per element (Azuma-Hoeffding on that element's whole
    # first-order error) for a composite bound with an l2 coefficient (Bound.sigma).
    events = ref.size if (bound.sigma is not None and not bound.accumulation) else ref.size * max(bound.k, 1.0)
    lam = confidence_lambda(events, p, u)
    # A NaN bound (inf * 0 inside a bound's own arithmetic) is no bound: +inf, which makes the verdict
    # "inconclusive" there rather than failing every nonzero error.
    bnd = _nan_to_inf(bound.array(dname, ref.shape, lam))
    worst_case = _nan_to_inf(bound.array(dname, ref.shape))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.where(err > 0, err / bnd, 0.0)
        ratio_wc = np.where(err > 0, err / worst_case, 0.0)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)  # err > 0 against a NaN/0 bound is a failure
    ratio_wc = np.where(np.isnan(ratio_wc), np.inf, ratio_wc)

    # Relative size of the bound: b_i against max(|ref_i|, rms(ref)) over the finite slots.  A reference that
    # is exactly zero everywhere has no size of its own: it is measured against the magnitude of the
    # computation on absolute values (rms of S), and a bound that is all underflow term (S = 0) is conclusive.
    # Below T's normal range (magnitude eta_T / u_T, the smallest normal number's order) T resolves absolute
    # differences of eta_T only, whatever the algorithm: a quantity there is measured against that floor.  A
    # reference that is exactly zero everywhere has no size: any finite bound is conclusive there (the tested
    # output must reproduce the zeros to within it).
    rms = _rms(ref[finite])
    size = max(rms, underflow_eta(dname) / u)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel_b = np.where(finite, np.where(np.isnan(bnd), np.inf, bnd) / np.maximum(np.abs(ref), size), 0.0)
    if rms == 0.0:
        rel_b = np.where(finite & ~np.isfinite(bnd), np.inf, 0.0)
    rel_b = np.where(finite & np.isnan(rel_b), np.inf, np.where(finite, rel_b, 0.0))
    max_rel_b = float(rel_b.max(initial=0.0))
    void = int(np.count_nonzero(rel_b >= 1.0))

    # The ensemble criterion, in units of each element's magnitude w_i = S_i + eta_T / u_T (sigma_i + eta_T / u_T where S_i is
    # not finite; finite even where the bound is not: _weights).  Members are compared where they, the tested output and the reference are finite.
    w = _weights(bound, ref, finite, dname)
    zmax, zrms = _z_stats(err, w, finite)
    stats: dict[str, tuple[float, float]] = {}
    outside = []
    for key, val in members.items():
        m = finite & np.isfinite(val)
        with np.errstate(invalid="ignore", over="ignore"):
            e_m = np.where(m, np.abs(val - ref), 0.0)
            stats[key] = _z_stats(e_m, w, m)
            # A member outside the bound is no evidence of what a correct implementation does (either the
            # member or the bound is wrong): it is named in the report and left out of the thresholds.
            if np.any(e_m > np.where(np.isnan(bnd), np.inf, bnd)):
                outside.append(key)
    # One rounding of the exact result into T (Higham eq. 2.8: u |ref_i| + eta_T; the eta_T term is the quantum
    # of T's subnormal range, where no algorithm can err by less than it).
    stats["final rounding"] = _z_stats(u * np.abs(ref) + underflow_eta(dname), w, finite)
    # Members equal to each other bit for bit are one sample of rounding error, not several (the four summation
    # orders coincide where every sum has one or two terms).
    distinct: list[np.ndarray] = []
    for val in members.values():
        if not any(np.array_equal(val, d, equal_nan=True) for d in distinct):
            distinct.append(val)
    if len(distinct) < 2 or int(np.count_nonzero(finite)) * len(distinct) < config.VERDICT_RMS_MIN_ELEMENTS:
        # One sample of another algorithm's rounding error says little about a third algorithm's (the max over a
        # handful of elements of two such samples can differ by 10x): with fewer than two distinct legitimate
        # evaluations, or fewer than VERDICT_RMS_MIN_ELEMENTS compared errors in all (a two-element output: the calibration's
        # factors hold for maxima over many elements), the random-rounding model's typical accumulated error,
        # sqrt(k) u S_i (k roundings of mean zero on the magnitude S_i, Higham & Mary 2019), joins as a
        # member.
        # sqrt(k) u S: the random-rounding model's typical size of the bound's own worst case k u S (S, the
        # computation on magnitudes, carries the conditioning: arccos near +-1 turns a cosine's last-bit error
        # into 1e4 ulps of the angle, |ref| does not know that).
        # Where the bound knows the l2 coefficient of each element's roundings (Bound.typical), that is the
        # model's typical error itself, u_T sqrt(sum_r c_r^2): sqrt(k) S_i bounds it only as a worst case of the
        # coefficients (each |c_r| <= S_i), which a resampling or a normalisation with a d-term norm is far from.
        s_mag = np.broadcast_to(np.asarray(bound.scale, dtype=np.float64), ref.shape)
        s_mag = math.sqrt(max(bound.k, 1.0)) * np.where(np.isfinite(s_mag), np.abs(s_mag), np.abs(ref))
        if bound.typical is not None:
            typ = np.abs(np.broadcast_to(np.asarray(bound.typical, dtype=np.float64), ref.shape))
            s_mag = np.where(np.isfinite(typ), typ, s_mag)
        stats["rounding model"] = _z_stats(u * s_mag, w, finite)
    if u <= unit_roundoff("float64"):
        # T is the reference's own precision: the reference is not more accurate than the tested code, and every
        # error above is measured against it, so each holds the reference's own rounding error too, of the same
        # order as the tested one's.  Its typical size under the random-rounding model, sqrt(k) u_64 S_i (k the
        # reference's own depth), joins as a member: a float64 GEMM whose blocking and FMA use differ from every
        # re-run variant (MKL on one CPU, OpenBLAS on another) is not "diverging" from a reference that errs as
        # much.  (A T coarser than float64 has a reference 2^29 or more times more accurate: no such member.)
        s_ref = np.broadcast_to(np.asarray(bound.scale, dtype=np.float64), ref.shape)
        s_ref = np.where(np.isfinite(s_ref), np.abs(s_ref), np.abs(ref))
        depth = bound.k if bound.ref_depth is None else bound.ref_depth
        stats["reference's own error"] = _z_stats(math.sqrt(max(depth, 1.0)) * u * s_ref, w, finite)
    usable = [v for key, v in stats.items() if key not in outside]
    zmax_thr = config.VERDICT_MAX_FACTOR * max(s[0] for s in usable)
    zrms_thr = config.VERDICT_RMS_FACTOR * max(s[1] for s in usable)
    have_ensemble = bool(members)

    reasons: list[str] = []
    notes = [f"ensemble member {key!r} is outside the bound: not used" for key in outside]
    if same:
        notes.append(f"ensemble member(s) {', '.join(repr(k) for k in same)} equal the tested output bit for bit:"
                     f" dropped")
    if not pattern_ok:
        reasons.append(f"NaN/Inf patterns differ: {pattern_msg}")
    over = ratio > 1.0
    if over.any():
        reasons.append(f"{int(over.sum())} element(s) outside the probabilistic bound (max err/bound "
                       f"{float(ratio.max()):.3g}; a false alarm has probability <= {p:.1e})")
    if have_ensemble and zmax > zmax_thr:
        reasons.append(f"largest error {zmax / max(zmax_thr, 1e-300) * config.VERDICT_MAX_FACTOR:.3g}x the"
                       f" largest of the legitimate evaluations (zmax {zmax:.3g} > {zmax_thr:.3g} ="
                       f" {config.VERDICT_MAX_FACTOR:g} x ensemble max)")
    rms_applies = int(np.count_nonzero(finite)) >= config.VERDICT_RMS_MIN_ELEMENTS
    if have_ensemble and rms_applies and zrms > zrms_thr:
        reasons.append(f"RMS error {zrms / max(zrms_thr, 1e-300) * config.VERDICT_RMS_FACTOR:.3g}x the largest"
                       f" of the legitimate evaluations (zrms {zrms:.3g} > {zrms_thr:.3g} ="
                       f" {config.VERDICT_RMS_FACTOR:g} x ensemble max)")
    range_only = False
    if reasons:
        verdict = DIVERGES
    elif excused.any():
        # T cannot represent the result there (a legitimate T evaluation is non-finite as the tested code is):
        # those slots were not checked, and an output that T cannot hold is no evidence of a correct port
        verdict = INCONCLUSIVE
        range_only = True
        reasons.append(f"{int(excused.sum())} slot(s) are beyond {dname}'s range (the tested code and a legitimate"
                       f" {dname} evaluation are non-finite where the reference is finite): they cannot be"
                       f" checked.  To make it conclusive: a higher precision, or inputs that {dname} can hold")
    else:
        nonfinite_bound = bool(np.any(finite & ~np.isfinite(bnd)))
        if nonfinite_bound or max_rel_b >= 1.0:
            verdict = INCONCLUSIVE
            what = ("the bound is not finite at some element" if nonfinite_bound else
                    f"the bound reaches the size of the quantity at {void} element(s) (relative bound up to"
                    f" {max_rel_b:.3g})")
            reasons.append(f"{what}: the check cannot tell a correct result from a wrong one.  To make it"
                           f" conclusive: compare stage by stage (teacher-forced), at a smaller size, or in a"
                           f" higher precision")
        else:
            verdict = MATCH
            if not have_ensemble:
                reasons.append("no ensemble of legitimate evaluations: judged by the bound alone")
    reasons += notes

    if ref.size:
        worst = np.unravel_index(int(np.argmax(ratio)), ref.shape) if ratio.max() > 0 else \
            np.unravel_index(int(np.argmax(err)), ref.shape)
        worst = tuple(int(i) for i in worst)
    else:
        worst = None
    ulps = ulp_distance(np.where(finite, act, 0.0), np.where(finite, ref, 0.0), dname)
    with np.errstate(over="ignore", invalid="ignore"):
        nref = float(np.sqrt(np.sum(np.where(finite, ref, 0.0) ** 2)))
        rel_err = float(np.sqrt(np.sum(err * err))) / nref if nref > 0 else (0.0 if not err.any() else math.inf)
    return ErrorReport(
        name=name, dtype=dname, shape=tuple(ref.shape), verdict=verdict, reasons=reasons, k=bound.k,
        note=bound.note, lam=lam, p_false_alarm=p, max_abs_err=float(err.max(initial=0.0)),
        max_err_over_bound=float(ratio.max(initial=0.0)), max_err_over_worst_case=float(ratio_wc.max(initial=0.0)),
        max_relative_bound=max_rel_b, worst_index=worst,
        worst_actual=float(act[worst]) if worst is not None else math.nan,
        worst_reference=float(ref[worst]) if worst is not None else math.nan,
        worst_bound=float(bnd[worst]) if worst is not None else math.nan,
        worst_case_bound=float(worst_case[worst]) if worst is not None else math.nan,
        ulp_at_worst=float(ulps[worst]) if worst is not None else 0.0, max_ulp=float(ulps.max(initial=0.0)),
        rel_err=rel_err, zmax=zmax, zrms=zrms, ensemble=stats, zmax_threshold=zmax_thr, zrms_threshold=zrms_thr,
        pattern_ok=pattern_ok, pattern_msg=pattern_msg,
        beyond_range=int(excused.sum()) if range_only else 0)


def assert_close(actual: Any, reference: Any, bound: Bound, dtype: Any, *, naive: Any = None,
                 ensemble: Mapping[str, Any] | None = None, name: str = "output",
                 p_false_alarm: float | None = None) -> ErrorReport:
    """:func:`compare`, raising ``AssertionError`` with the full report unless the verdict is "match"."""
    report = compare(actual, reference, bound, dtype, naive=naive, ensemble=ensemble, name=name,
                     p_false_alarm=p_false_alarm)
    if not report.ok:
        raise AssertionError(f"error-model comparison: {report.verdict}\n" + str(report))
    return report


def assert_no_divergence(actual: Any, reference: Any, bound: Bound, dtype: Any, *, naive: Any = None,
                         ensemble: Mapping[str, Any] | None = None, name: str = "output",
                         p_false_alarm: float | None = None) -> ErrorReport:
    """:func:`compare`, raising ``AssertionError`` only when the verdict is "diverges"; returns the report.

    For property tests whose object is the bound itself (the reference against an mpmath oracle, the two
    association orders of an attention against each other, a kernel against its NumPy twin in a precision
    where the bound is known to be void in places): everything checkable is checked (NaN/Inf patterns, the
    bound where it is finite, the ensemble criterion), and an "inconclusive" verdict is returned, never
    reported as a match.  Not for judging an implementation: that is :func:`assert_close`."""
    report = compare(actual, reference, bound, dtype, naive=naive, ensemble=ensemble, name=name,
                     p_false_alarm=p_false_alarm)
    if report.verdict == DIVERGES:
        raise AssertionError(f"error-model comparison: {report.verdict}\n" + str(report))
    return report


# ---------------------------------------------------------------------------------------------------
# Stage-wise (teacher-forced) comparison
# ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a module, for a teacher-forced comparison.

    name      : the stage, and the name of the tensor it produces.
    inputs    : the names of the tensors it consumes (the module's input, or earlier stages' outputs).
    reference : float64 arrays of ``inputs`` -> the stage's output (the paper's equation for this stage).
    bound     : (float64 arrays of ``inputs``, dtype=T) -> :class:`Bound` of the stage computed in T on them.
    equation  : where the stage is written down (paper and equation).
    alternatives : other legitimate algorithms for the same equation, ``(name, fn)`` pairs, each a float64
            function of ``inputs`` like ``reference`` (a complex-FFT convolution for a real-FFT one): where the
            comparison is given a ``naive`` runner, each is run in T on the stage's inputs as the naive run is and
            joins the stage's ensemble.  For a stage whose tested code has no variant in :mod:`refimpl.ensemble`
            (every torch variant computes the same bits), they are the evaluations that tell what another
            correct algorithm errs, instead of the random-rounding model's worst-case-shaped sqrt(k) u S.

    Teacher forcing: each stage is evaluated on the *tested* implementation's own inputs to it (rounded to T,
    hence exact data for the stage), so its bound holds its own rounding errors only.  A module whose
    whole-module bound is void (relative >= 1) - the errors of a long chain of stages propagated through
    their Jacobians in absolute value - is judged stage by stage instead: every stage must match."""

    name: str
    inputs: tuple[str, ...]
    reference: Callable[..., np.ndarray]
    bound: Callable[..., "Bound"]
    equation: str = ""
    alternatives: tuple = ()


@dataclasses.dataclass
class StageReport:
    """What :func:`compare_stages` measured: one :class:`ErrorReport` per stage, in order.

    ``verdict``: "diverges" when any stage diverges (``first_divergence`` names the first), else
    "inconclusive" when any stage is, else "match"."""

    verdict: str
    stages: list[ErrorReport]
    first_divergence: str | None

    @property
    def ok(self) -> bool:
        """Whether no stage diverges and none is inconclusive (the verdict is "match")."""
        return self.verdict == MATCH

    def __str__(self) -> str:
        """The stage-wise comparison as text: the verdict and first divergence, a row per stage, then the full report of
        each stage that does not match."""
        head = f"stage-wise (teacher-forced) comparison: {self.verdict.upper()}"
        if self.first_divergence is not None:
            head += f"; first divergence at stage {self.first_divergence!r}"
        rows = [f"  {r.name:<10s} {r.verdict:<12s} err/bound {r.max_err_over_bound:9.3g}  relative bound "
                f"{r.max_relative_bound:9.3g}  k {r.k:9.4g}  rel. error {r.rel_err:9.3g}" for r in self.stages]
        details = [str(r) for r in self.stages if r.verdict != MATCH]
        return "\n".join([head] + rows + details)


def compare_stages(stages: Sequence[Stage], tensors: Mapping[str, Any], dtype: Any, *,
                   naive: Callable[..., Any] | None = None,
                   ensembles: Mapping[str, Mapping[str, Any]] | None = None,
                   p_false_alarm: float | None = None) -> StageReport:
    """Teacher-forced comparison of a tested module, stage by stage.

    Parameters
    ----------
    stages : the module's :class:`Stage` list, in execution order (e.g.
        :func:`refimpl.attention.focused.focused_linear_attention_stages`).
    tensors : name -> the tested implementation's tensor: every stage's output and every input a stage
        names (captured from the tested code, e.g. with forward hooks).
    dtype : T, the precision the tested code computed in.
    naive : optional ``naive(fn, *arrays, dtype=T)`` (:func:`refimpl.numerics.naive_same_precision`): each
        stage's reference run in T on the same inputs joins its ensemble, so the ensemble criterion applies.
    ensembles : optional stage name -> {member name: tensor}: legitimate evaluations of that stage in T, each
        computed from the tested code's own inputs to the stage (teacher-forced; the equivalence suite's
        ``stage_ensemble`` re-runs a twin under refimpl.ensemble's variants with every stage tensor forced).
        With at least two distinct members a stage's threshold is set by real algorithms; with the naive run
        alone the random-rounding model's sqrt(k) u S joins (:func:`compare`).  A stage's
        :attr:`Stage.alternatives` join too, each run in T by ``naive``.
    p_false_alarm : the whole comparison's budget (default ``config.VERDICT_FALSE_ALARM``), split evenly
        between the stages (union bound).

    Returns
    -------
    :class:`StageReport`."""
    p = config.VERDICT_FALSE_ALARM if p_false_alarm is None else float(p_false_alarm)
    for s in stages:
        for key in (s.name,) + tuple(s.inputs):
            if key not in tensors:
                raise KeyError(f"argument 'tensors': stage {s.name!r} needs tensor {key!r}; given "
                               f"{sorted(tensors)}")
    reports: list[ErrorReport] = []
    for s in stages:
        args = [_to_numpy64(tensors[key]) for key in s.inputs]
        ref = s.reference(*args)
        nv = None if naive is None else naive(s.reference, *args, dtype=dtype)
        members = dict((ensembles or {}).get(s.name) or {})
        if naive is not None:
            for alt_name, fn in s.alternatives:
                members[f"numpy {alt_name}"] = naive(fn, *args, dtype=dtype)
        reports.append(compare(tensors[s.name], ref, s.bound(*args, dtype=dtype), dtype, naive=nv,
                               ensemble=members or None, name=s.name, p_false_alarm=p / len(stages)))
    first = next((r.name for r in reports if r.verdict == DIVERGES), None)
    if first is not None:
        verdict = DIVERGES
    elif any(r.verdict == INCONCLUSIVE for r in reports):
        verdict = INCONCLUSIVE
    else:
        verdict = MATCH
    return StageReport(verdict, reports, first)


def _to_numpy64(x: Any) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor; torch is never imported here
        x = x.detach().cpu()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        x = x.double().numpy()
    return np.asarray(x, dtype=np.float64)
