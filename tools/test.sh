#!/usr/bin/env bash
# The test command: installs what the tests need (tools/setup.sh), then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
