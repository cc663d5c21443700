#!/usr/bin/env bash
# Builds the book into book/_build/html, strictly and offline (called by `make book`, repo root as cwd).
#
#  * Strict: -W -n --keep-going (any warning or broken reference fails the build) and MyST-NB's
#    raise-on-error (any cell error fails it).
#  * No stale outputs: notebook outputs are cached by jupyter-cache, keyed by each notebook's code
#    cells. The cache is additionally keyed here by a hash of every src/agent_lab/**/*.py file (and the
#    book's _config.yml, pyproject.toml, and the benchmark figures and the committed policy under bench/results/, with their reader
#    bench/_results.py, which the results page renders): when that hash changes the whole cache is wiped, so every chapter runs again
#    against the new package. Sphinx itself always re-reads every page (--all), so warnings are
#    reported on every build, not only on the first.
#  * Parallel: uncached chapters are executed by a pool of AGENT_LAB_BOOK_JOBS workers (default nproc)
#    straight into that cache before Sphinx runs; Sphinx then renders from the cache.
#  * Offline: MathJax 3 comes from the npm package mathjax@$MATHJAX_VERSION, installed once into
#    .venv/share/agent-lab-book (git-ignored) and copied by Sphinx into _build/html/_static/mathjax.
#    Widgets render as static figures (AGENT_LAB_STATIC_WIDGETS=1, see src/agent_lab/widgets.py).
#
# Environment: AGENT_LAB_BOOK_FORCE=1 wipes the cache unconditionally (always re-executes);
# AGENT_LAB_BOOK_DIR and AGENT_LAB_SOURCE_DIR (defaults book, src/agent_lab) let the staleness test
# build a small book against a scratch package.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
BOOK=${AGENT_LAB_BOOK_DIR:-book}
SOURCE=${AGENT_LAB_SOURCE_DIR:-src/agent_lab}
BUILD=$BOOK/_build
CACHE=$BUILD/.jupyter_cache
STAMP=$BUILD/.agent_lab_source_hash
ASSETS=.venv/share/agent-lab-book
MATHJAX_VERSION=3.2.2
MATHJAX_DIR=$ASSETS/static/mathjax

mkdir -p "$BUILD"
# Several people may build at once in one checkout: take turns instead of clobbering each other's output.
exec 9>"$BUILD/.build.lock"
flock 9

# --- 1. local MathJax --------------------------------------------------------------------------
if [ ! -f "$MATHJAX_DIR/tex-chtml.js" ] || [ "$(cat "$ASSETS/mathjax.version" 2>/dev/null)" != "$MATHJAX_VERSION" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "error: npm is needed once to fetch mathjax@$MATHJAX_VERSION (apt-get install npm)" >&2
    exit 1
  fi
  echo "installing mathjax@$MATHJAX_VERSION into $ASSETS (one time)"
  rm -rf "$ASSETS/npm" "$MATHJAX_DIR"
  mkdir -p "$ASSETS/npm" "$ASSETS/static"
  npm install --prefix "$ASSETS/npm" "mathjax@$MATHJAX_VERSION" --no-audit --no-fund --no-save --loglevel=error
  # es5/ is the browser build; copy it whole so lazily loaded components (menu, a11y) resolve locally.
  cp -r "$ASSETS/npm/node_modules/mathjax/es5" "$MATHJAX_DIR"
  echo "$MATHJAX_VERSION" > "$ASSETS/mathjax.version"
fi

# --- 2. execution cache keyed by the package source ---------------------------------------------
source_hash=$(
  { find "$SOURCE" -name '*.py' -print0 | sort -z | xargs -0 sha256sum; sha256sum "$BOOK/_config.yml" pyproject.toml;
    find bench/_results.py bench/results -type f -print0 2>/dev/null | sort -z | xargs -0 -r sha256sum; } \
    | sha256sum | cut -d' ' -f1
)
if [ "${AGENT_LAB_BOOK_FORCE:-0}" = "1" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$source_hash" ]; then
  if [ -d "$CACHE" ]; then echo "package source ($SOURCE) changed: clearing the notebook execution cache"; fi
  rm -rf "$CACHE"
fi

# --- 3. build ------------------------------------------------------------------------------------
export AGENT_LAB_STATIC_WIDGETS=1
export MPLBACKEND=Agg
export PYTHONHASHSEED=0
# One thread per kernel: the machine is small and the chapters' tensors are tiny.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
rm -f "$STAMP"
rm -rf "$BUILD/html"  # no page of a renamed or deleted chapter survives

# Execute the chapters that are not cached yet in parallel (AGENT_LAB_BOOK_JOBS workers, default: the
# number of cores) and store them in the same jupyter-cache that MyST-NB reads, keyed the same way; Sphinx
# then only renders. A chapter that fails here is simply left uncached: the Sphinx pass below executes it
# again and reports the error (raise-on-error fails the build).
"$PY" - "$BOOK" "$CACHE" "${AGENT_LAB_BOOK_JOBS:-$(getconf _NPROCESSORS_ONLN)}" <<'PYEOF'
import concurrent.futures as cf
import sys
import time
from pathlib import Path

import yaml
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from jupyter_cache.executors.utils import single_nb_execution
from myst_nb.core.read import read_myst_markdown_notebook

book, cache_path, jobs = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
timeout = int(yaml.safe_load((book / "_config.yml").read_text())["execute"]["timeout"])
chapters = sorted(p for p in book.glob("part*/*.md") if p.read_text(encoding="utf-8").lstrip().startswith("---"))


def read(path: Path):
    return read_myst_markdown_notebook(path.read_text(encoding="utf-8"), add_source_map=True, path=str(path))


def run(path: Path):
    try:
        notebook = read(path)
        result = single_nb_execution(notebook, cwd=str(path.parent), timeout=timeout, allow_errors=False,
                                     meta_override=True)
        return path, notebook, result.time, result.err
    except Exception as exc:  # e.g. a dead kernel: leave the chapter to the Sphinx pass, which reports it
        return path, None, 0.0, exc


cache = get_cache(cache_path)
todo = []
for path in chapters:
    try:
        cache.match_cache_notebook(read(path))
    except KeyError:
        todo.append(path)
print(f"pre-executing {len(todo)} of {len(chapters)} chapters with {jobs} workers", flush=True)
start = time.time()
with cf.ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
    for path, notebook, seconds, err in pool.map(run, todo):
        if err is not None:
            print(f"  {path}: failed ({type(err).__name__}); the build will report it", flush=True)
            continue
        cache.cache_notebook_bundle(CacheBundleIn(notebook, str(path.resolve()), data={"execution_seconds": seconds}),
                                    check_validity=False, overwrite=True)
        print(f"  {path}: {seconds:.1f} s", flush=True)
print(f"pre-execution took {time.time() - start:.0f} s wall", flush=True)
PYEOF
.venv/bin/jupyter-book build "$BOOK" --builder html --all -W -n --keep-going
# Only a successful build validates the cache for this source hash.
echo "$source_hash" > "$STAMP"
echo "book built: $BUILD/html/index.html"
