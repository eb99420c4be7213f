#!/usr/bin/env bash
# Creates .venv and installs Stator with the given extra (default: dev). Idempotent; used by demo.sh, test.sh and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-dev}"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# Pinned to the set the suite last passed on (ops/constraints.txt): an upstream release cannot break a fresh install.
.venv/bin/python -m pip install -q -c ops/constraints.txt -e ".[${extra}]"
# Our own modules compiled once, here: where PYTHONDONTWRITEBYTECODE is set (this CI machine sets it), every
# process would otherwise compile them from source at each start (~0.4 s of CPU per meta node, more per cluster
# than its election). A source edited later is compiled in memory again (pyc files are checked by mtime).
.venv/bin/python -m compileall -q -j 0 meta broker client ops migrations tests
