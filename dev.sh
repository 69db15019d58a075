#!/usr/bin/env bash
# One entry point for a fresh machine (Python 3.11+, Java 17): creates .venv, installs Eddyline
# with what the task needs, then runs it.
#   ./dev.sh demo [eddyline demo options]   the demo on local Spark with the built-in generator
#   ./dev.sh test [pytest options]          lint (ruff), the layer contracts, the user guide, then the test suite
#   ./dev.sh bench [script]                 the benchmarks in bench/
#   ./dev.sh shell                          a shell with the venv active
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "error: need Python 3.11 or newer as '$PY' (set PYTHON=...)" >&2; exit 1
fi
if ! command -v java >/dev/null 2>&1; then
  echo "error: Spark needs Java 17 on PATH (java not found)" >&2; exit 1
fi
cmd=${1:-help}; shift || true
extras=""
case "$cmd" in
  test) extras="[test]" ;;
  bench) extras="[test,bench]" ;;
esac
stamp=".venv/.installed${extras}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "installing Eddyline${extras} and its dependencies into .venv (the first time takes a few minutes)..." >&2
  if ! { .venv/bin/python -m pip install --upgrade pip && .venv/bin/python -m pip install -e ".${extras}"; } \
      > .venv/install.log 2>&1; then
    tail -n 40 .venv/install.log >&2; echo "error: installation failed (full log: .venv/install.log)" >&2; exit 1
  fi
  touch "$stamp"
fi
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
case "$cmd" in
  demo) exec .venv/bin/eddyline demo "$@" ;;
  test)
    # the dashboard's browser test drives the system's Chromium: Debian's, installed here where
    # this user may (root with apt-get); elsewhere that test says why it skips
    if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "installing Debian's chromium for the dashboard test..." >&2
      { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; } \
        > .venv/chromium-install.log 2>&1 || echo "warning: could not install chromium (see .venv/chromium-install.log)" >&2
    fi
    # style, the layer rules (pyproject.toml) and the user guide's links first, then the suite
    .venv/bin/ruff check eddyline tests bench
    .venv/bin/lint-imports
    NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir .venv/site
    set +e; .venv/bin/python -m pytest "$@"; rc=$?; [ $rc -eq 5 ] && rc=1; exit $rc ;;
  bench) exec .venv/bin/python "${1:-bench/run_bench.py}" "${@:2}" ;;
  shell) exec bash --rcfile <(echo "source .venv/bin/activate") ;;
  *) sed -n '2,7p' "$0"; exit 2 ;;
esac
