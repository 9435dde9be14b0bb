#!/usr/bin/env bash
# The test run: Lavapipe pinned, synchronization validation on, device required.
set -euo pipefail
cd "$(dirname "$0")/../.."
source ci/lavapipe/env.sh
exec .venv/bin/python -m pytest --durations=25 "$@"
