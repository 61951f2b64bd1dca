#!/usr/bin/env bash
# Runs the Python package's tests (//python:python_test) from the test's
# runfiles: the package, its generated stubs and gradsync's binaries.
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
export GRADSYNC_BIN="$PWD" PYTHONDONTWRITEBYTECODE=1
# The test files to run (and pytest's options) come from the target's args.
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "$@"
