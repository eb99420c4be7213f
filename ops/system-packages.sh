#!/usr/bin/env bash
# The system packages the tests need beside Python: PostgreSQL server binaries (the projection's PostgreSQL tests,
# tests/support/pg.py), a Java runtime, 17 or newer, for Spark (the lineage tests), Chromium for the web console's browser
# tests (Playwright drives the system binary: its own browser download is not reachable everywhere) and promtool
# and prometheus (Debian's prometheus package) to check the alert rules in ops/deploy/ and scrape the netns
# deploy test, with iproute2 for that test's namespaces, and redis-server, the peer ops/bench/broker_vs_redis runs
# (and its test). Installs what is missing on Debian or Ubuntu when run as root; otherwise prints the exact command
# to run and exits 1. Installs nothing that is present.
# Usage: system-packages.sh [postgres] [java] [chromium] [promtool] [redis]   (default: all; the demo needs only java)
set -euo pipefail
needs=" ${*:-postgres java chromium promtool redis} "

missing=()
have_postgres() {
    { command -v initdb && command -v postgres; } >/dev/null 2>&1 && return 0
    for d in /usr/lib/postgresql/*/bin; do
        [[ -x "$d/initdb" && -x "$d/postgres" ]] && return 0
    done
    return 1
}
java_major() {
    command -v java >/dev/null 2>&1 || { echo 0; return; }
    java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

[[ $needs != *" postgres "* ]] || have_postgres || missing+=(postgresql)
[[ $needs != *" java "* ]] || (( $(java_major) >= 17 )) || missing+=(openjdk-17-jre-headless)
[[ $needs != *" chromium "* ]] || command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[[ $needs != *" promtool "* ]] || { command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing+=(prometheus)
# tests/test_netns_deploy.py makes its hosts with ip netns, veth and a bridge
[[ $needs != *" promtool "* ]] || command -v ip >/dev/null 2>&1 || missing+=(iproute2)
[[ $needs != *" redis "* ]] || command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# tests/support/pg.py runs the server as this user when the tests run as root (initdb refuses root).
if [[ $needs == *" postgres "* ]] && [[ $(id -u) -eq 0 ]] && ! id postgres >/dev/null 2>&1 && [[ ! " ${missing[*]} " == *" postgresql "* ]]; then
    echo "system-packages: creating the system user 'postgres' (tests/support/pg.py runs PostgreSQL as it under root)" >&2
    useradd --system --home-dir /var/lib/postgresql --shell /usr/sbin/nologin postgres
fi
(( ${#missing[@]} == 0 )) && exit 0

command="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "system-packages: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    echo "system-packages: the tests need ${missing[*]}; as root on Debian or Ubuntu run:" >&2
    echo "  $command" >&2
    exit 1
fi
