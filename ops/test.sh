#!/usr/bin/env bash
# Installs everything the tests need (a fresh machine has none of it) and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/system-packages.sh
bash ops/setup-env.sh dev
# Two workers (pytest-xdist, `--dist loadscope`: a module's tests stay on one worker): 14 min instead of 22 on the
# 2-core CI machine. tests/conftest.py gives each worker its own port slice and starts the longest modules first;
# --no-loadscope-reorder keeps that order (xdist otherwise hands out modules by how many tests they hold, which
# started the 70-second one-test lineage module twelve minutes in).
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadscope --no-loadscope-reorder "$@"
