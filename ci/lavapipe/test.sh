#!/usr/bin/env bash
# The test run: Lavapipe pinned, synchronization validation on, device required.
set -euo pipefail
cd "$(dirname "$0")/../.."
source ci/lavapipe/env.sh
# Two workers, each test file on one (its module fixtures, models and servers
# made once): on a 2-core machine the suite's Python, subprocess and Lavapipe
# waits overlap. VKSPEC_TEST_WORKERS=0 runs it in this one process.
exec .venv/bin/python -m pytest -n "${VKSPEC_TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
