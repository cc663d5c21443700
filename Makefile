# agent-lab: one Makefile for readers, students and instructors.
#   make        set up, build the book, release the assignment, grade the sample submissions
#   make test   set up, then run every test (book build and browser test included)
# Both create .venv with the machine's python3 when it is missing or older than pyproject.toml.

PYTHON3 ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PY      := $(BIN)/python
STAMP   := $(VENV)/.installed
# The machine keeps a CPU build of torch in /opt/wheels; use it when present so pip never pulls a CUDA build.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export MPLBACKEND := Agg
export PYTHONHASHSEED := 0

SUBMISSIONS ?= autograder/samples

.PHONY: all install sysdeps tour book assignments grade grade-samples test coverage mutation bench crafting-curve clean

all: install tour book assignments grade-samples

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(FIND_LINKS) -e '.[test]'
	@touch $@

install: $(STAMP)

# System packages for the browser test (chromium) and the grading sandbox (bubblewrap).
sysdeps:
	@bash scripts/sysdeps.sh

tour: install
	$(BIN)/agent-lab tour

book: install sysdeps
	@bash scripts/build_book.sh

assignments: install
	@bash scripts/release_assignments.sh

grade: install sysdeps
	@bash scripts/grade.sh "$(SUBMISSIONS)"

grade-samples: install sysdeps assignments
	@bash scripts/grade.sh autograder/samples

test: install sysdeps book assignments
	$(PY) -m pytest -n 2 --dist loadgroup --durations=15

coverage: install
	$(PY) -m pytest -q tests/estimators tests/test_training_api.py --cov=agent_lab.estimators --cov=agent_lab.training --cov-report=term-missing

# Mutation testing of the modules listed in pyproject.toml's [tool.mutmut] (not part of make test; it takes a
# while). Prints the score and every surviving mutant; `mutmut show NAME` shows one.
mutation: install
	$(BIN)/mutmut run --max-children 2
	$(PY) scripts/mutation_report.py

bench: install
	@for f in bench/bench_*.py bench/gpu_bench.py; do echo "== $$f"; $(PY) $$f || exit 1; done

# A crafting recipe's learning curve, resumable: run it again to continue (bench/crafting_curve.py --help), e.g.
#   nohup make crafting-curve ARGS="--recipe crafting-full --seed 0" > curve.log 2>&1 &
crafting-curve: install
	$(PY) bench/crafting_curve.py $(ARGS)

clean:
	rm -rf book/_build assignments/release autograder/_work .pytest_cache mutants
