"""Assemble README.md, the front door: docs/README.head.md (what this is, two commands, a short tour) and a
linked index of the per-topic documents in docs/ (each written next to its code).  Run ``python docs/assemble_readme.py`` after editing any of them;
tests/test_readme.py fails when README.md is out of date.
"""

from __future__ import annotations

import pathlib
import re

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent

#: (section title, documents in order).  Every docs/*.md except the head and LINKED must appear exactly once.
SECTIONS = [
    ("Mechanisms", ["linear.md", "softmax.md", "l2vit.md", "flatten.md", "rala.md", "castling.md", "lisa.md"]),
    ("Networks", ["models_l2vit_ravlt_lisanet.md", "models_flatten_castling.md"]),
    ("Fast paths and benchmarks", ["backends.md", "kernels_c.md", "benchmarks.md"]),
]

#: Documents indexed under their own heading (benchmarks/verdict.py writes docs/verdict.md).
LINKED = ["verdict.md", "bound_tightness.md", "guarantees.md", "design.md", "verify.md"]


def _demote(text: str) -> str:
    """Shift headings so each document's top heading becomes a level-3 heading under its section."""
    levels = [len(m.group(1)) for m in re.finditer(r"^(#+) ", text, flags=re.M)]
    shift = 3 - min(levels) if levels else 0
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"^#+ ", line):
            line = "#" * shift + line
        out.append(line)
    return "\n".join(out).strip() + "\n"


def _title(name: str) -> str:
    text = (DOCS / name).read_text()
    return next(line for line in text.splitlines() if line.startswith("#")).lstrip("#").strip()


def assemble() -> str:
    """README.md: the front door (docs/README.head.md) and an index of the documents, linked, not inlined."""
    parts = [(DOCS / "README.head.md").read_text().strip() + "\n", "## Documentation\n"]
    for title, names in SECTIONS + [("The verdict, the guarantees, the design and the verify tool", LINKED)]:
        parts.append(f"**{title}**\n")
        parts += [f"- [{_title(n)}](docs/{n})" for n in names if (DOCS / n).exists()]
        parts.append("")
    return "\n".join(parts)


if __name__ == "__main__":
    (ROOT / "README.md").write_text(assemble())
    print(f"wrote {ROOT / 'README.md'}")
