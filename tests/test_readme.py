"""The README is generated from docs/ and the Python snippets of the README and of docs/ run as printed.

Every ```python block of README.md and docs/*.md is executed in a fresh interpreter (fragments that are not meant to
run are fenced as ```py or ```pycon instead).  A snippet that raises is a broken promise to a new user.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import assemble_readme  # noqa: E402

README = (ROOT / "README.md").read_text()
SNIPPETS = [s for text in [README] + [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))
                                                   if p.name != "README.head.md"]
            for s in re.findall(r"```python\n(.*?)```", text, flags=re.S)]


def test_readme_is_assembled_from_docs():
    assert README == assemble_readme.assemble(), "README.md is stale: run python docs/assemble_readme.py"


def test_readme_has_runnable_snippets():
    assert len(SNIPPETS) >= 5


def test_readme_is_a_front_door():
    """What this is, two commands, a short tour and links: not the whole documentation inlined."""
    assert len(README.splitlines()) < 250
    for name in assemble_readme.LINKED + [n for _, names in assemble_readme.SECTIONS for n in names]:
        assert f"(docs/{name})" in README


@pytest.mark.parametrize("i", range(len(SNIPPETS)))
def test_readme_snippet_runs(i):
    code = SNIPPETS[i]
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"README snippet {i} failed:\n{code}\n--- stderr ---\n{r.stderr[-3000:]}"
