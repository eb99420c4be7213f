#!/usr/bin/env bash
# Installs everything the tests need (a fresh machine has none of it) and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/system-packages.sh
bash ops/setup-env.sh dev
# Three workers on 2 cores (pytest-xdist, `--dist loadscope`: a module's tests stay on one worker): most modules wait
# on real processes and timers, and a third worker fills that idle time: 11 min instead of 16 with two on this
# 2-core machine (2026-12-04), 22 with one. tests/conftest.py gives each worker its own port slice and starts the
# longest modules first; --no-loadscope-reorder keeps that order (xdist otherwise hands out modules by how many
# tests they hold, which started the 70-second one-test lineage module twelve minutes in).
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 3 --dist loadscope --no-loadscope-reorder "$@"
