"""Verify a third-party PyTorch implementation against the reference: a verdict, the first stage where it
diverges, and why.

Layer: the verify tool, on top of the verdict (:mod:`refimpl.verdict`), the references
(:mod:`refimpl.attention`) and torch (imported here; ``import refimpl`` never imports this package).  The
command line (:mod:`refimpl.cli`, ``refimpl verify``) is a thin layer over :func:`verify`.

What happens::

    module = your nn.Module (an instance, or a class / factory called with ``init``)
    weights: a file or dict loaded into it (strict), or every floating tensor redrawn from ``seed``
    module cast to ``dtype``; its parameters, read back, are the reference's parameters (mapping.py)
    configuration inferred from the module's attributes and weight shapes, the rest from ``preset``
    input drawn from ``seed`` (or given), rounded to ``dtype``; the reference is fed the same values
    forward hooks on the submodules the mapping pairs with the reference's record each stage's tensors
    whole module: refimpl.verdict.compare against the reference's bound in ``dtype``
    stage by stage (teacher-forced): each observed stage against the reference stage on the module's own
        inputs to it; a submodule fed something other than its predecessor's output is a wiring divergence
    shadow mode (``shadow=True``): each submodule computing a stage also run on the reference's own input to it
        (rounded to ``dtype``) and judged against that stage: an error located without propagation
    gradients (``grad=True``; for a network from its logits, :mod:`.network_gradients`): the input and parameter gradients for a random cotangent against
        those of refimpl's float64 PyTorch twin (its forward first checked against the NumPy reference),
        each against its bound (:mod:`.gradients`)
    the ensemble (``ensemble=True``, the default): refimpl's PyTorch twin of the reference, loaded with the mapped
        weights in ``dtype``, run plainly and under every variant of :mod:`refimpl.ensemble` (whole module; per
        stage teacher-forced on the module's own stage tensors; for a network its logits, and each unit and part
        teacher-forced on the network's own input to it): the legitimate evaluations the ensemble criterion
        compares the module's error with, besides the NumPy naive run in ``dtype`` (:mod:`.ensemble`)

The verdict is "match", "diverges" or "inconclusive" (the bound cannot resolve the answer: the report says
what would).  Shifted windows (Swin's softmax window attention and FLatten's Swin layout on the whole grid, with
the cyclic shift and the shift mask; square or (wh, ww) windows; Swin's pre-windowed ``WindowAttention(x, mask)``,
its grid padded) are :mod:`.windows`.  Not yet built: the references of LiSA's direct forms, block and 1-D / 3-D
grids; configurations (heads, width) drawn by ``examples``; a torch
ensemble for a network's ``examples`` and for the layouts and precisions no twin runs in (the report says which).
"""

from __future__ import annotations

from typing import Any

from .loading import VerifyError, instantiate, load_target, load_weights
from .mapping import WeightMapping, map_weights
from .registry import REFERENCES, get_reference
from .report import SCHEMA_VERSION, Report, StageResult
from .networks import is_network, network_names, verify_network
from .run import verify

__all__ = ["verify", "verify_examples", "assert_matches", "Report", "StageResult", "VerifyError", "REFERENCES",
           "SCHEMA_VERSION", "load_target", "instantiate", "load_weights", "map_weights", "WeightMapping",
           "verify_network", "network_names", "is_network"]


def verify_examples(module: Any, reference: str, examples: int, *, max_side: int | None = None, seed: int = 0,
                    **kwargs: Any) -> Report:
    """:func:`verify` on ``examples`` inputs drawn by Hypothesis: the batch (1 to 3), the grid (H and W each a
    multiple of the module's step, per axis for a (wh, ww) window, up to ``max_side``, unless the module fixes its grid) and the seed of the
    weights and input.  Returns the report of the failing example Hypothesis shrinks to (the smallest batch and
    grid, square before non-square), or, when every example matches, of the one closest to its bound.  The
    report's ``findings`` say which example it is.  ``module`` must be a class or factory (``init``): each
    example builds a fresh module.  ``max_side`` defaults to 12.  For a registered network: image sizes, the batch (1 or 2) and
    the seed drawn from ``seed`` (:func:`refimpl.verify.network_examples.verify_network_examples`; ``max_side``: the largest
    image side); a network built for one resolution is rebuilt for each size on both sides, ``module`` taking the
    size by a keyword (``img_size``, ``image_size``, ...: :data:`refimpl.verify.network_examples.SIZE_KEYWORDS`);
    there ``ensemble`` (the twin network's members, :func:`verify`) defaults to False, as it costs a twin run per
    variant and unit for every example; ``ensemble=True`` (the command line's default) judges each example with them."""
    from hypothesis import HealthCheck, Phase, given, settings, strategies as st

    from .network_examples import verify_network_examples
    from .networks import is_network
    from .steps import _check_grad, _example_factory, _example_score, _run_examples
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise VerifyError(f"argument 'examples': expected an integer >= 1, got {examples!r}")
    _check_grad(kwargs.get("grad", False))
    if is_network(reference):
        # the twin's members cost a twin run per variant and unit for every example: off unless asked for
        kwargs.setdefault("ensemble", False)
        from .. import bounds
        from .run import _conv_algorithms
        algorithms, min_batch = _conv_algorithms(kwargs.pop("conv_algorithms", None), kwargs.get("device", "cpu"),
                                                 kwargs.get("dtype", "float32"))
        with bounds.covering_conv_algorithms(*algorithms, min_batch=min_batch):
            return verify_network_examples(module, reference, examples, max_side=max_side, seed=seed, **kwargs)
    max_side = 12 if max_side is None else max_side
    module = _example_factory(module)
    first = verify(module, reference, seed=seed, **kwargs)          # the configuration, and usage errors, once
    step = get_reference(reference).grid_step(_setup_of(first))
    fixed = step is None
    sh, sw = (step, step) if fixed or isinstance(step, int) else step        # a (wh, ww) window: a step per axis
    sides = st.just(tuple(first.config["hw"])) if fixed else st.tuples(
        st.integers(1, max(1, max_side // sh)).map(lambda m: m * sh),
        st.integers(1, max(1, max_side // sw)).map(lambda m: m * sw))
    other = {k: v for k, v in kwargs.items() if k not in ("hw", "batch", "input")}
    worst: dict[str, Any] = {"report": first, "score": -1.0, "example": None}
    failing: list[tuple[Report, dict]] = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck),      # no explain phase: it reruns a shrunk failure
              phases=[p for p in Phase if p is not Phase.explain])   # dozens of times to name the varying args
    @given(batch=st.integers(1, 3), hw=sides, ex_seed=st.integers(0, 15))   # a small seed range: cheap to shrink
    def run(batch, hw, ex_seed):
        r = verify(module, reference, hw=hw, batch=batch, seed=ex_seed, **other)
        ex = {"batch": batch, "hw": list(hw), "seed": ex_seed}
        score = _example_score(r)
        if r.verdict != "match":
            failing.append((r, ex))
            raise AssertionError(r.verdict)
        if score > worst["score"]:
            worst.update(report=r, score=score, example=ex)

    return _run_examples(run, examples, failing, worst,
                         lambda ex: f"batch {ex['batch']}, grid {ex['hw']}, seed {ex['seed']}", str)


def _setup_of(report: Report) -> Any:
    """A minimal object with the configuration and grid of ``report`` (for Reference.grid_step)."""
    cfg_fields = {k: v for k, v in report.config.items() if k != "hw"}
    return type("S", (), {"cfg": type("C", (), cfg_fields), "hw": tuple(report.config["hw"])})


def assert_matches(module: Any, reference: str, **kwargs: Any) -> Report:
    """:func:`verify`, raising ``AssertionError`` with the report unless the verdict is "match" (for a user's
    own test suite)."""
    report = verify(module, reference, **kwargs)
    if not report.ok:
        raise AssertionError(str(report) + "\n" + report.whole_module_text)
    return report
