"""benchmarks/run.py --auto-table-ops: one operation's auto-table entry replaced from a partial run, every other
entry kept, the merge recorded; an operation the run did not measure is refused by name."""

from __future__ import annotations

import json

from benchmarks.run import merge_auto_table


def test_merge_replaces_only_the_named_operation(tmp_path, capsys):
    path = tmp_path / "auto_table.json"
    path.write_text(json.dumps({"generated_by": "benchmarks/run.py", "generated": "then", "threads": 2,
                                "ops": {"depthwise_conv2d": {"float64": ["c", "numba", "numpy"]},
                                        "lisa_local_convolve": {"float64": ["numpy"]}}}))
    run = {"generated_by": "benchmarks/run.py", "generated": "now", "threads": 2,
           "ops": {"lisa_local_convolve": {"float64": ["numba", "numpy"], "default": ["numba", "numpy"]},
                   "depthwise_conv2d": {"float64": ["numpy", "c"]}}}
    assert merge_auto_table(run, ["lisa_local_convolve"], path) == 0
    got = json.loads(path.read_text())
    assert got["ops"]["lisa_local_convolve"] == run["ops"]["lisa_local_convolve"]
    assert got["ops"]["depthwise_conv2d"] == {"float64": ["c", "numba", "numpy"]}       # untouched
    assert got["generated"] == "then" and got["merged"] == {"lisa_local_convolve": {"generated": "now", "threads": 2}}
    assert merge_auto_table(run, ["softmax"], path) == 2
    assert "no backend kernel for ['softmax']" in capsys.readouterr().err
    assert json.loads(path.read_text()) == got
