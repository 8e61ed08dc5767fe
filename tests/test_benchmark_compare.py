"""benchmarks/compare.py, the regression guard: a cell is "slower" only beyond both runs' own repeat spread."""

from __future__ import annotations

import json

from benchmarks import compare


def _write(path, rows, meta=None):
    path.write_text(json.dumps({"meta": meta or {"threads": [1]}, "rows": rows}))
    return path


def _row(model, threads, **times):
    row = {"model": model, "threads": threads, "params": 10, "best_backend": "c"}
    row.update({f"{k}_times": v for k, v in times.items()})
    return row


def test_slower_beyond_the_noise_band_and_only_then(tmp_path):
    old = _write(tmp_path / "old.json", [_row("a", 1, torch=[1.0, 1.05], refimpl_c=[2.0, 2.02, 2.04]),
                                         _row("a", 2, torch=[0.6, 0.6])])
    new = _write(tmp_path / "new.json", [_row("a", 1, torch=[1.08, 1.09], refimpl_c=[2.5, 2.51]),
                                         _row("a", 2, torch=[0.5])])
    cells, _, _ = compare.compare(old, new)
    got = {(c["row"]["threads"], c["timing"]): c["verdict"] for c in cells}
    # torch, 1 thread: best 1.08 against 1.0, spreads 5% and 0.9%: the band is 1.05 x 1.009 = 1.059 < 1.08
    assert got[(1, "torch")] == "slower"
    assert got[(1, "refimpl_c")] == "slower"                # 2.5 > 2.0 * 1.02 * 1.004
    assert got[(2, "torch")] == "no noise"                  # one repeat in the new run: no estimate
    assert compare.main([str(old), str(new)]) == 1


def test_inside_the_band_is_same_and_exits_zero(tmp_path):
    old = _write(tmp_path / "old.json", [_row("a", 1, torch=[1.0, 1.2])])
    new = _write(tmp_path / "new.json", [_row("a", 1, torch=[1.15, 1.16])])   # 1.15 <= 1.0 * 1.2 * 1.0087
    cells, _, _ = compare.compare(old, new)
    assert [c["verdict"] for c in cells] == ["same"]
    assert compare.main([str(old), str(new)]) == 0


def test_rows_match_by_identity_not_by_outcome(tmp_path):
    """best_backend (an outcome) and params/gmacs (measurements) are not part of a row's identity."""
    a = _row("m", 1, torch=[1.0, 1.0])
    b = dict(_row("m", 1, torch=[1.0, 1.0]), best_backend="numba", params=11)
    cells, _, _ = compare.compare(_write(tmp_path / "o.json", [a]), _write(tmp_path / "n.json", [b]))
    assert len(cells) == 1 and cells[0]["verdict"] == "same"
