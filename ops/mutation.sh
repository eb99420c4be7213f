#!/usr/bin/env bash
# Mutation testing with mutmut (docs/testing.md) over the modules where a one-line bug loses data, or the ones named:
#   bash ops/mutation.sh                                  # all of them, smallest first
#   bash ops/mutation.sh broker/fencing.py meta/deciders  # a path as listed below (a file or a package)
#   bash ops/mutation.sh --report [module...]             # the table of the results kept in mutants/, no run
# mutmut reads [tool.mutmut] in pyproject.toml: which modules it mutates, which fast tests it may run. It works in
# mutants/ (ignored by git) and keeps its results there: a second run reuses the mutants and the test map, and runs
# again every mutant of the modules named. Prints, per module, the tool's own verdicts and the kill rate as
# `mutmut badge` counts it: (killed + timeout) / (mutants - skipped); a mutant not checked (a run stopped early)
# counts as not killed. MUTATION_JOBS sets the workers (default: cores).
# The survivors: .venv/bin/mutmut results; one mutant's diff: .venv/bin/mutmut show NAME.
set -euo pipefail
cd "$(dirname "$0")/.."

all=(broker/fencing.py broker/locks.py client/slots.py meta/deciders broker/pop broker/storage meta/raft/roles.py
     meta/raft/journal.py)
report_only=0
if [ "${1:-}" = "--report" ]; then report_only=1; shift; fi
if [ "$#" -gt 0 ]; then modules=("$@"); else modules=("${all[@]}"); fi
jobs="${MUTATION_JOBS:-$(nproc)}"
mutmut=.venv/bin/mutmut
[ -x "$mutmut" ] || bash ops/setup-env.sh dev   # a fresh machine: the dev extra brings mutmut
mkdir -p mutants

prefix_of() {   # broker/fencing.py -> broker.fencing. ; meta/deciders/ -> meta.deciders.
    local m="${1%/}"
    m="${m%.py}"
    echo "${m//\//.}."
}

declare -A seconds
for module in "${modules[@]}"; do
    seconds[$module]="-"
    [ "$report_only" = 1 ] && continue
    prefix="$(prefix_of "$module")"
    log="mutants/run-${prefix%.}.log"
    echo "== $module: mutmut run '${prefix}*' (log: $log)"
    start=$(date +%s)
    if ! "$mutmut" run --max-children "$jobs" "${prefix}*" >"$log" 2>&1; then
        tr '\r' '\n' <"$log" | tail -n 20 >&2
        echo "mutmut failed on $module" >&2
        exit 1
    fi
    seconds[$module]=$(( $(date +%s) - start ))
done

"$mutmut" results --all true >mutants/results.txt
echo
printf '%-22s %7s %7s %7s %8s %8s %11s %6s %9s %7s\n' module mutants killed timeout survived "no tests" "not checked" \
    other "kill rate" seconds
for module in "${modules[@]}"; do
    prefix="$(prefix_of "$module")"
    PREFIX="$prefix" MODULE="$module" SECONDS_TAKEN="${seconds[$module]}" .venv/bin/python - <<'EOF'
import collections, os
counts = collections.Counter()
for line in open("mutants/results.txt"):
    name, _, status = line.strip().rpartition(": ")
    if name.startswith(os.environ["PREFIX"]):
        counts[status] += 1
total = sum(counts.values())
known = ("killed", "timeout", "survived", "no tests", "not checked", "skipped")
other = total - sum(counts[k] for k in known)
tested = total - counts["skipped"]
rate = f"{100 * (counts['killed'] + counts['timeout']) / tested:.1f}%" if tested else "-"
print(f"{os.environ['MODULE']:<22} {total:>7} {counts['killed']:>7} {counts['timeout']:>7} {counts['survived']:>8} "
      f"{counts['no tests']:>8} {counts['not checked']:>11} {other:>6} {rate:>9} {os.environ['SECONDS_TAKEN']:>7}")
EOF
done
