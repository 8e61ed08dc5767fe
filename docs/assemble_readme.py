"""Assemble README.md from docs/README.head.md and the per-topic documents in docs/.

The topic documents are the sources (each written next to its code); README.md is generated so a reader
finds everything on one page.  Run ``python docs/assemble_readme.py`` after editing any of them;
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

#: Documents linked from the README head instead of inlined: generated tables (benchmarks/verdict.py writes
#: docs/verdict.md).
LINKED = ["verdict.md", "design.md", "verify.md"]


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


def assemble() -> str:
    parts = [(DOCS / "README.head.md").read_text().strip() + "\n"]
    toc = ["## Contents\n"]
    body = []
    for title, names in SECTIONS:
        toc.append(f"- {title}")
        body.append(f"\n## {title}\n")
        for name in names:
            path = DOCS / name
            if not path.exists():
                continue
            text = _demote(path.read_text())
            first = next(line for line in text.splitlines() if line.startswith("###"))
            toc.append(f"  - {first.lstrip('#').strip()} (source: `docs/{name}`)")
            body.append(text)
    return "\n".join(parts + ["\n".join(toc) + "\n"] + body)


if __name__ == "__main__":
    (ROOT / "README.md").write_text(assemble())
    print(f"wrote {ROOT / 'README.md'}")
