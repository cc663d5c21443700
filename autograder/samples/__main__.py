"""``python -m autograder.samples OUT [ASSIGNMENT]``: build the sample submissions of an assignment."""
import sys
from pathlib import Path

import nbformat

from autograder import grade, samples

if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m autograder.samples OUT_DIR [ASSIGNMENT]")
    name = sys.argv[2] if len(sys.argv) == 3 else grade.DEFAULT_ASSIGNMENT
    if name not in samples.BUILDERS:
        sys.exit(f"no sample submissions for {name!r}; assignments with samples: {sorted(samples.BUILDERS)}")
    out = grade.DEFAULT_OUT.resolve() if name == grade.DEFAULT_ASSIGNMENT else grade.DEFAULT_OUT.resolve() / name
    release = grade.prepare_course(out, grade.DEFAULT_SOURCE, name)
    source = nbformat.read(grade.DEFAULT_SOURCE / name / f"{name}.ipynb", as_version=4)
    build = getattr(samples, samples.BUILDERS[name])
    entries = build(Path(sys.argv[1]), source, nbformat.read(release, as_version=4), name)
    print(f"built {len(entries)} sample submissions of {name} in {sys.argv[1]}")
