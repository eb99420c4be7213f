#!/usr/bin/env bash
# Installs everything the tests need (a fresh machine has none of it) and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/system-packages.sh
bash ops/setup-env.sh dev
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
