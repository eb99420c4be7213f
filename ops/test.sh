#!/usr/bin/env bash
# Installs everything the tests need (a fresh machine has none of it) and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/system-packages.sh
bash ops/setup-env.sh dev
# Two workers (pytest-xdist), each taking whole modules: most tests wait on real processes, so two share the two
# cores well; tests/conftest.py gives each worker its own ports and starts the longest modules first.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadscope "$@"
