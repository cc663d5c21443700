"""Code cites the book by file, and every cited chapter exists; lecture references name the lecture's sections,
not the file names of the source texts."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.glob("src/agent_lab/**/*.py"), *ROOT.glob("bench/*.py"), ROOT / "ARCHITECTURE.md"])
CITE = re.compile(r"(?:book/)?(part[1-3]/\d\d_[a-z0-9_]+)(?:\.md)?")


def test_every_cited_chapter_file_exists():
    cited, missing = set(), []
    for path in SOURCES:
        for m in CITE.finditer(path.read_text()):
            cited.add(m.group(1))
            if not (ROOT / "book" / f"{m.group(1)}.md").exists():
                missing.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert len(cited) >= 15, f"expected the code to cite most chapters, found {sorted(cited)}"
    assert not missing, "cited chapters that do not exist:\n" + "\n".join(missing)


def test_no_code_cites_a_source_text_by_its_file_name():
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in SOURCES for i, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"seed 00\d", line, re.IGNORECASE)]
    assert not bad, "cite the lecture section (e.g. 'lecture notes section 3'), not the seed file:\n" + "\n".join(bad)

