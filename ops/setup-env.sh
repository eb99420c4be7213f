#!/usr/bin/env bash
# Creates .venv and installs Stator with the given extra (default: dev). Idempotent; used by demo.sh, test.sh and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-dev}"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[${extra}]"
