#!/usr/bin/env bash
# make assignments: build the student version of every assignment with nbgrader.
#   assignments/source/<name>/  (solutions and hidden tests, committed)
#   -> assignments/release/<name>/  (stubs, visible tests only; built, git-ignored)
# nbgrader's course root is assignments/ and its config assignments/nbgrader_config.py.
set -euo pipefail
cd "$(dirname "$0")/../assignments"
# nbgrader runs `alembic` (a console script next to it) from PATH: put the venv first.
[ -d ../.venv/bin ] && export PATH="$PWD/../.venv/bin:$PATH"
NBGRADER="nbgrader"
for dir in source/*/; do
    name="$(basename "$dir")"
    "$NBGRADER" generate_assignment "$name" --force --log-level=WARN
    echo "released assignments/release/$name"
done
