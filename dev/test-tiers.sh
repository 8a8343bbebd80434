#!/usr/bin/env bash
# `make test`'s pytest run: every tier, in two concurrent pytest sessions.
#
# The cluster tiers (tests/cluster, tests/e2e) spend most of their time waiting
# on the API server, the schedulers and timers; the local tiers (tests/unit,
# tests/trainer, tests/images) are CPU-bound torch and pip work that needs no
# cluster. Run one beside the other and the wall time is roughly the longer
# of the two, not their sum. Both sessions always run to the end; the
# cluster tiers stream to the terminal, the local tiers' output follows them,
# and the exit status is non-zero if either failed.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
logs=.test-logs
mkdir -p "$logs"
local_log="$logs/local-tiers.log"

# Heaviest first: torch processes and pip installs then overlap the cluster
# tiers' API-bound start, and the light unit tests overlap their CPU-bound end
# (the e2e tier trains for real), instead of the other way round.
"$py" -m pytest tests/trainer tests/images tests/unit "$@" >"$local_log" 2>&1 &
local_pid=$!
trap 'kill "$local_pid" 2>/dev/null' EXIT INT TERM

"$py" -m pytest tests/cluster tests/e2e "$@"
cluster_rc=$?
wait "$local_pid"
local_rc=$?
trap - EXIT INT TERM

echo
echo "======== tests/trainer tests/images tests/unit (ran beside the cluster tiers; $local_log) ========"
cat "$local_log"
echo
echo "cluster tiers (tests/cluster tests/e2e): exit $cluster_rc; local tiers (tests/trainer tests/images tests/unit): exit $local_rc"
[ "$cluster_rc" -eq 0 ] && [ "$local_rc" -eq 0 ]
