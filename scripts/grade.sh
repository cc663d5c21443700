#!/usr/bin/env bash
# make grade SUBMISSIONS=<dir> / make grade-samples: autograde a folder of submissions in the sandbox.
#   <dir> holds one folder or .zip per student. autograder/samples is a recipe: the sample
#   submissions of both assignments are built from the current sources (into autograder/_work/samples and
#   autograder/_work/crafting_agent/samples) and graded, each into its own course folder.
#   Another assignment: GRADE_ARGS="--assignment crafting_agent --out autograder/_work/crafting_agent".
# Results: autograder/_work/grades.csv, grades_by_test.csv, course/gradebook.db (nbgrader's),
#          course/feedback/<student>/policy_gradients/policy_gradients.html, and a summary table.
# Extra options go to the grader, e.g. GRADE_ARGS="--jobs 1 --cell-timeout 120".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
dir="${1:-autograder/samples}"
if [ ! -d "$dir" ]; then
    echo "grade: SUBMISSIONS=$dir is not a directory (one folder or .zip per student)" >&2
    exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
    # bubblewrap binds the interpreter, then drops to a per-student uid: that needs root.
    exec sudo -E "$0" "$@"
fi
if [ "$(realpath "$dir")" = "$(realpath autograder/samples)" ]; then
    "$PY" -m autograder.samples autograder/_work/samples
    # shellcheck disable=SC2086
    "$PY" -m autograder.grade autograder/_work/samples ${GRADE_ARGS:-}
    "$PY" -m autograder.samples autograder/_work/crafting_agent/samples crafting_agent
    # The reference sample hands in the course's reference agent on purpose; a student's copy earns nothing.
    # shellcheck disable=SC2086
    exec "$PY" -m autograder.grade autograder/_work/crafting_agent/samples --assignment crafting_agent \
        --out autograder/_work/crafting_agent --accept-reference-checkpoint ${GRADE_ARGS:-}
fi
# shellcheck disable=SC2086
exec "$PY" -m autograder.grade "$dir" ${GRADE_ARGS:-}
