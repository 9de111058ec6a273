#!/usr/bin/env bash
# The test suite on all three Keras backends: the fast tests on each backend,
# then the slow integration tests (real data, subprocesses, other backends) once.
# Usage: bash tools/test.sh [extra pytest arguments]
set -u
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=2
status=0
# Lint and format first (configured in pyproject.toml): seconds, and a finding
# fails the run. `ruff check --fix .` and `ruff format .` fix most.
echo "=== ruff"
python -m ruff check . || status=1
python -m ruff format --check . || status=1
# The fast tests compile hundreds of tiny programs that each run for
# milliseconds, mostly on one core: XLA skips LLVM's optimisations there (the
# same programs, less optimised machine code) and pytest-xdist runs a test
# file per core. PyTorch's tests compile little, so there a second worker
# only competes for the cores (the file takes about twice as long with two).
# The slow tests run one at a time and compile as users do.
fast_xla_flags="${XLA_FLAGS:-} --xla_backend_optimization_level=0"
for backend in tensorflow jax torch; do
  echo "=== KERAS_BACKEND=$backend: fast tests"
  workers=(--numprocesses=auto --maxprocesses=4 --dist=loadfile)
  [ "$backend" = torch ] && workers=(--numprocesses=0)
  XLA_FLAGS="$fast_xla_flags" KERAS_BACKEND=$backend \
    python -m pytest -m "not slow" -q "${workers[@]}" "$@" || status=1
done
echo "=== KERAS_BACKEND=tensorflow: slow integration tests"
KERAS_BACKEND=tensorflow python -m pytest -m slow -q "$@" || status=1
exit $status
