"""The ``refimpl`` command line: ``refimpl verify ...`` (also ``python -m refimpl verify ...``).

Layer: the command line, a thin layer over :func:`refimpl.verify.verify` (docs/verify.md).  Exit status:
0 match, 1 diverges, 3 inconclusive (the bound cannot resolve the answer; the report says what would), 2 any
usage, loading or mapping error (the message names the problem).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

EXIT = {"match": 0, "diverges": 1, "inconclusive": 3}


def _json_arg(name: str, text: str | None) -> Any:
    if text is None:
        return None
    try:
        if text.endswith(".json"):
            with open(text) as fh:
                return json.load(fh)
        return json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(_usage(f"argument --{name}: expected JSON or a .json file, got {text!r} ({exc})"))


def _usage(msg: str) -> int:
    print(f"refimpl: error: {msg}", file=sys.stderr)
    return 2


def _pair(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        h, w = (int(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(_usage(f"argument --hw: expected H,W (two integers), got {text!r}"))
    return h, w


def _render(report: Any) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(report)
        return
    con = Console()
    colour = {"match": "green", "diverges": "red", "inconclusive": "yellow"}.get(report.verdict, "white")
    con.print(f"[bold {colour}]{report.verdict.upper()}[/] against {report.reference} ({report.preset} preset, "
              f"{report.dtype})")
    sh = report.shadow is not None
    t = Table("stage", "observed at", "verdict", "max |err|", "bound", "err/bound",
              *(("shadow", "shadow err/bound") if sh else ()), "detail")
    for i, s in enumerate(report.stages):
        g = (lambda v: "-" if v is None else f"{v:.3g}")
        t.add_row(s.name, s.foreign or "-", s.verdict, g(s.max_abs_err), g(s.bound), g(s.err_over_bound),
                  *((report.shadow[i].verdict, g(report.shadow[i].err_over_bound)) if sh else ()),
                  (s.detail or (report.shadow[i].detail if sh and report.shadow[i].verdict == "diverges" else ""))[:80])
    con.print(t)
    if report.has_units:
        _render_units(con, Table, report)
    wm = report.whole_module
    con.print(f"whole module: {wm['verdict']} (max relative bound {wm['max_relative_bound']:.3g}, "
              f"err/bound {wm['err_over_bound']:.3g})")
    if report.first_divergence:
        con.print(f"[red]first divergence[/]: {report.first_divergence['stage']}: {report.first_divergence['why']}")
    if report.shadow_first_divergence:
        con.print(f"[red]shadow mode, first divergence[/]: {report.shadow_first_divergence['stage']}: "
                  f"{report.shadow_first_divergence['why']}")
    if report.gradients is not None:
        _render_gradients(con, Table, report.gradients)
    con.print(report.ensemble_text(), markup=False, highlight=False)
    for f in report.findings:
        con.print(f"finding ({f['kind']}): {f['message']}")


def _render_units(con: Any, Table: Any, report: Any) -> None:
    """A network's units and their parts (a unit judged part by part): all of them when few
    (config.VERIFY_SUMMARY_ROWS), else the ones that do not match and a count of the others."""
    from . import config
    con.print(report.units_summary(), markup=False, highlight=False)
    rows, left = report.compact_unit_rows(config.VERIFY_SUMMARY_ROWS)
    if rows:
        colour = {"match": "green", "diverges": "red", "inconclusive": "yellow"}
        t = Table("unit / part", "verdict", "worst err/bound", "first divergence")
        for r in rows:
            v = r["verdict"]
            t.add_row(("  " if r["part"] else "") + r["name"], f"[{colour.get(v, 'white')}]{v}[/]",
                      "-" if r["err_over_bound"] is None else f"{r['err_over_bound']:.3g}", r["first_divergence"])
        con.print(t)
    if left:
        con.print(f"({left} more units and parts match)")


def _render_gradients(con: Any, Table: Any, gr: dict) -> None:
    """The gradient section (``--grad``): the twin's forward check, then one row per gradient tensor."""
    colour = {"match": "green", "diverges": "red", "inconclusive": "yellow"}.get(gr.get("verdict"), "white")
    tf = gr.get("twin_forward", {})
    con.print(f"gradients: [bold {colour}]{str(gr.get('verdict')).upper()}[/] (twin {gr.get('twin')}: float64 "
              f"forward {tf.get('verdict')} against the NumPy reference; cotangent {gr.get('cotangent')})")
    if gr.get("why"):
        con.print(gr["why"])
    g = (lambda v: "-" if v is None else (v if isinstance(v, str) else f"{v:.3g}"))
    t = Table("gradient of", "yours", "verdict", "max |err|", "bound", "err/bound", "detail")
    for row in gr.get("tensors", []):
        t.add_row(row["name"], row["foreign"] or "-", row["verdict"], g(row["max_abs_err"]), g(row["bound"]),
                  g(row["err_over_bound"]), (row["detail"] or "").split(";")[0][:60])
    con.print(t)
    fd = gr.get("first_divergence")
    if fd:
        con.print(f"[red]first gradient divergence[/]: {fd['tensor']}: {fd['why']}")


def _verify(ns: argparse.Namespace) -> int:
    from . import verify as v

    if ns.list:
        from . import models as rm
        refs = {name: {"summary": r.summary, "presets": list(r.presets)} for name, r in v.REFERENCES.items()}
        for name in v.network_names():
            cfg = rm.entry(name).config
            refs[name] = {"summary": f"network ({rm.family_of(name).__name__}), verified unit by unit",
                          "presets": list(v.networks.network_presets(cfg)) or ["registered"]}
        print(json.dumps(refs, indent=1) if ns.json == "-" else "\n".join(
            f"{name}: {d['summary']} (presets: {', '.join(d['presets'])})" for name, d in refs.items()))
        return 0
    if ns.target is None or ns.reference is None:
        return _usage("verify needs TARGET and --reference (or --list)")
    inp = None
    if ns.input is not None:
        try:
            w = v.load_weights(ns.input)
        except v.VerifyError as exc:
            return _usage(str(exc).replace("'weights'", "'input'"))
        if len(w) != 1:
            return _usage(f"argument --input: expected one array in {ns.input!r}, found {sorted(w)}")
        inp = next(iter(w.values()))
    kw = dict(preset=ns.preset, config=_json_arg("config", ns.config), init=_json_arg("init", ns.init),
              weights=ns.weights, map=_json_arg("map", ns.map), dtype=ns.dtype, device=ns.device, seed=ns.seed,
              call=_json_arg("call", ns.call), shadow=ns.shadow, grad=ns.grad, ensemble=not ns.no_ensemble,
              conv_algorithms=None if ns.conv_algorithms == "auto" else tuple(
                  a for a in ns.conv_algorithms.split(",") if a and a != "direct"))
    try:
        if ns.examples:
            if inp is not None:
                return _usage("--examples draws its own inputs; it takes no --input")
            if ns.max_side is not None and ns.max_side < 1:
                return _usage(f"argument --max-side: expected an integer >= 1, got {ns.max_side}")
            report = v.verify_examples(ns.target, ns.reference, ns.examples, max_side=ns.max_side, **kw)
        else:
            report = v.verify(ns.target, ns.reference, input=inp, hw=_pair(ns.hw), batch=ns.batch,
                              progress=ns.json != "-" and sys.stderr.isatty(), **kw)
    except v.VerifyError as exc:
        return _usage(str(exc))
    if ns.json:
        text = report.to_json()
        if ns.json == "-":
            print(text)
        else:
            with open(ns.json, "w") as fh:
                fh.write(text + "\n")
    if ns.report:
        import os
        png = os.path.splitext(ns.report)[0] + ".png"
        plotted = report.save_plot(png)
        with open(ns.report, "w") as fh:
            fh.write(report.to_markdown(os.path.basename(png) if plotted else None))
    if ns.json != "-":
        _render(report)
    return EXIT.get(report.verdict, 1)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``refimpl`` command (``python -m refimpl``): parse ``argv`` (default sys.argv[1:]) and run the
    subcommand; returns the exit status (verify: 0 match, 1 diverges or inconclusive, 2 usage or loading error)."""
    ap = argparse.ArgumentParser(prog="refimpl", description="refimpl: the reference of vision linear attention")
    sub = ap.add_subparsers(dest="command", required=True)
    vp = sub.add_parser("verify", help="verify a PyTorch module against a reference (docs/verify.md)")
    vp.add_argument("target", nargs="?", help="package.module:Name or path/to/file.py:Name")
    vp.add_argument("--reference", help="the reference to compare with: an attention reference or a registered "
                                        "network name (--list shows them)")
    vp.add_argument("--list", action="store_true", help="list the references")
    vp.add_argument("--preset", default=None, help="the reference preset (default: the reference's own, "
                    "'official', or 'paper' where no code is released)")
    vp.add_argument("--init", help="JSON keyword arguments for the class or factory")
    vp.add_argument("--call", help="JSON keyword arguments of forward ($H, $W, $HW substituted)")
    vp.add_argument("--config", help="JSON reference configuration fields (override inference and preset)")
    vp.add_argument("--weights", help=".safetensors, .npz or .pt/.pth (weights_only) state_dict")
    vp.add_argument("--map", help='JSON {"rename": {foreign: reference}, "ignore": [foreign]}')
    vp.add_argument("--input", help=".npz or .safetensors holding the input array")
    vp.add_argument("--hw", help="the token grid H,W (for a network: the image size, default 224,224)")
    vp.add_argument("--batch", type=int, default=None, help="the batch (default 2; 1 for a network)")
    vp.add_argument("--dtype", default="float32", choices=("float64", "float32", "float16", "bfloat16"))
    vp.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    vp.add_argument("--seed", type=int, default=0)
    vp.add_argument("--examples", type=int, default=0,
                    help="verify N Hypothesis-drawn inputs (batch, grid or image size, seed); report the shrunk failing "
                         "one.  A network built for one resolution is rebuilt per size: TARGET must take the size "
                         "by a keyword (img_size, image_size, ...; e.g. --init '{\"img_size\": [224, 224]}')")
    vp.add_argument("--max-side", type=int, default=None,
                    help="with --examples: the largest grid / image side drawn (default 12 for a layer; for a network "
                         "the largest side of its image)")
    vp.add_argument("--shadow", action="store_true",
                    help="also run each of your submodules on the reference's own input to its stage (rounded to "
                         "--dtype): a shadow column per stage, an error located without propagation")
    vp.add_argument("--grad", action="store_true",
                    help="also compare your input and parameter gradients for a random cotangent with those of "
                         "refimpl's float64 PyTorch twin of the reference (a layer reference, or a registered "
                         "network: its logits' cotangent, for every example with --examples)")
    vp.add_argument("--no-ensemble", action="store_true",
                    help="judge against the NumPy naive run and the random-rounding model only, without re-running "
                         "refimpl's PyTorch twin of the reference under other summation orders, elementary-function "
                         "evaluations, FFT convolution and oneDNN toggled (faster, looser; docs/verify.md)")
    vp.add_argument("--conv-algorithms", default="auto",
                    help="the convolution algorithms the bounds cover besides direct evaluation: 'auto' (what the "
                         "run may take: winograd,fft on CUDA and on a CPU with oneDNN off and NNPACK on), 'direct' "
                         "(none), or a comma list of winograd, fft (their errors are 10^2 - 10^5 times a direct "
                         "convolution's, and the convolution stages' bounds widen as much)")
    vp.add_argument("--report", help="write the report as Markdown to this file (and a plot beside it when "
                                     "matplotlib is installed)")
    vp.add_argument("--json", help="write the JSON report to this file ('-': standard output, no table)")
    try:
        ns = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) and 2
    try:
        return _verify(ns)
    except SystemExit as exc:      # raised by the argument helpers with a usage status
        return int(exc.code) if isinstance(exc.code, int) else 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
