#!/usr/bin/env bash
# The main job: install, start a local cluster (3 meta nodes, 3 brokers, SQLite projection) and run the demo.
# The cluster keeps running afterwards; stop it with: .venv/bin/stator dev down --dir demo-cluster
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/system-packages.sh java   # Spark, for the lineage step
bash ops/setup-env.sh spark   # the service and what the lineage step needs; no test tools
exec .venv/bin/python -m ops.demo --dir demo-cluster "$@"
