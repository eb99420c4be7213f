#!/usr/bin/env bash
# Rewrites ops/constraints.txt with the newest releases pyproject.toml allows: a throwaway venv takes every extra
# (dev holds them all), and its freeze becomes the file. Run the suite on it before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e ".[dev]"
{ sed -n '/^#/p' ops/constraints.txt; "$venv/bin/python" -m pip freeze --exclude-editable; } > ops/constraints.txt.new
mv ops/constraints.txt.new ops/constraints.txt
git --no-pager diff --stat -- ops/constraints.txt
