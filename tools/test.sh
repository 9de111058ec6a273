#!/usr/bin/env bash
# The test suite on all three Keras backends: the fast tests on each backend,
# then the slow integration tests (real data, subprocesses, other backends) once.
# Usage: bash tools/test.sh [extra pytest arguments]
set -u
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=2
status=0
for backend in tensorflow jax torch; do
  echo "=== KERAS_BACKEND=$backend: fast tests"
  KERAS_BACKEND=$backend python -m pytest -m "not slow" -q "$@" || status=1
done
echo "=== KERAS_BACKEND=tensorflow: slow integration tests"
KERAS_BACKEND=tensorflow python -m pytest -m slow -q "$@" || status=1
exit $status
