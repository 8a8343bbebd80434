#!/usr/bin/env bash
# `make test`'s pytest run: every tier, in three concurrent pytest sessions.
#
#   dev/test-tiers.sh [PYTEST ARGS]   run the tiers (the args go to every session)
#   dev/test-tiers.sh down            stop the e2e tier's cluster (make cluster-down)
#
# The cluster tier (tests/cluster) and the e2e tier (tests/e2e) spend most of
# their time waiting on API servers, schedulers, timers and trainers; the
# local tiers (tests/trainer, tests/images, tests/unit) are CPU-bound torch
# and pip work that needs no cluster. One after the other they leave much of
# the machine idle, so each runs in a pytest session of its own, all three at
# once, and the wall time is roughly the longest session's, not their sum.
#
# The cluster tier uses the local cluster in .cluster/ on the default ports
# (or a running one there: a `make demo`'s); the e2e tier gets a second local
# cluster of its own in .cluster-e2e/, every port shifted by 1000 (on top of
# any TORCHFLEET_CLUSTER_PORT_OFFSET), so the two never meet and neither
# touches a demo's. The e2e session streams to the terminal (it is the
# longest); the other two write to .test-logs/ and are printed after it, and
# every session's failures are listed last, one line each.
# Every session runs to the end, and the exit status is non-zero if any
# failed. Interrupted (Ctrl-C, SIGTERM), the sessions are stopped as Ctrl-C
# stops pytest (tests/conftest.py), so their fixtures stop what they started,
# and the clusters this run started are stopped whatever happened.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
logs=.test-logs
# A Python process that crashes (SIGSEGV, SIGABRT: the pytest sessions, the
# operators and trainers they start) prints every thread's stack to its
# stderr, which lands in a log CI shows: pytest's own fault handler stops at
# the end of the session, and a crash while the interpreter shut down left
# nothing but an exit status (139) once.
export PYTHONFAULTHANDLER=1

e2e_cluster_dir=.cluster-e2e
e2e_port_offset=$((${TORCHFLEET_CLUSTER_PORT_OFFSET:-0} + 1000))
e2e_env=(TORCHFLEET_CLUSTER_DIR="$e2e_cluster_dir" TORCHFLEET_CLUSTER_PORT_OFFSET="$e2e_port_offset")

stop_e2e_cluster() {
    env "${e2e_env[@]}" "$py" dev/cluster/localcluster.py down
}

if [ "${1:-}" = down ]; then
    stop_e2e_cluster
    exit
fi

mkdir -p "$logs"
rm -f "$logs"/*.xml # a report of an earlier run is not this run's
# A cluster left by an interrupted run would be reused, state and all: the
# e2e tier's is this script's alone, so it always starts fresh.
stop_e2e_cluster
# The default cluster is stopped at the end only if nothing was running there
# before (a demo's stays up).
default_cluster_was_up=$("$py" dev/cluster/localcluster.py status 2>/dev/null \
    | "$py" -c 'import json, sys; print(json.load(sys.stdin)["healthy"])' 2>/dev/null)

declare -A session_name session_start session_log
running=()
start_session() { # NAME LOG(- for the terminal) ENV... -- PYTEST ARGS...
    local name=$1 log=$2
    shift 2
    local env=()
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    if [ "$log" = - ]; then
        env "${env[@]}" "$py" -m pytest "$@" &
    else
        env "${env[@]}" "$py" -m pytest "$@" >"$log" 2>&1 &
    fi
    session_name[$!]=$name
    session_start[$!]=$SECONDS
    session_log[$!]=$log
    running+=("$!")
}

cleanup() {
    # SIGTERM, again every few seconds: a test may hold SIGTERM for itself
    # (tests/conftest.py restores the session's handler after it). Two minutes
    # for the fixtures to stop what they started, then SIGKILL.
    local deadline=$((SECONDS + 120)) alive state
    while :; do
        alive=()
        for pid in "${running[@]}"; do
            state=$(ps -o stat= -p "$pid") && [ "${state:0:1}" != Z ] || continue
            kill -TERM "$pid" && alive+=("$pid")
        done
        [ "${#alive[@]}" -gt 0 ] && [ "$SECONDS" -lt "$deadline" ] || break
        sleep 5
    done
    for pid in "${alive[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    wait
    stop_e2e_cluster
    if [ "$default_cluster_was_up" != True ]; then
        "$py" dev/cluster/localcluster.py down
    fi
}
trap 'echo "interrupted: stopping the test sessions and their clusters (logs in $logs/)" >&2; exit 130' INT TERM
trap cleanup EXIT

# The local tiers heaviest first: their torch processes and pip installs then
# overlap the cluster tiers' API-bound start, and the light unit tests their
# CPU-bound end (the e2e tier trains for real), not the other way round.
start_session "tests/trainer tests/images tests/unit" "$logs/local-tiers.log" -- \
    tests/trainer tests/images tests/unit --junitxml="$logs/local-tiers.xml" "$@"
start_session "tests/cluster" "$logs/cluster-tier.log" -- \
    tests/cluster --junitxml="$logs/cluster-tier.xml" "$@"
start_session "tests/e2e (cluster in $e2e_cluster_dir/)" - "${e2e_env[@]}" -- \
    tests/e2e --junitxml="$logs/e2e-tier.xml" "$@"

summary=()
done_logs=()
failed=0
while [ "${#running[@]}" -gt 0 ]; do
    wait -n -p finished "${running[@]}"
    rc=$?
    still=()
    for pid in "${running[@]}"; do [ "$pid" = "$finished" ] || still+=("$pid"); done
    running=("${still[@]}")
    minutes=$(awk -v s=$((SECONDS - session_start[$finished])) 'BEGIN { printf "%.1f", s / 60 }')
    how="exit $rc"
    # 128+N: pytest itself died of signal N (a crash, not a failed test).
    [ "$rc" -gt 128 ] && how+=" (killed by SIG$(kill -l $((rc - 128))))"
    summary+=("  ${session_name[$finished]}: $how in $minutes min")
    [ "$rc" -eq 0 ] || failed=1
    if [ "${session_log[$finished]}" != - ]; then
        done_logs+=("$finished")
    fi
done

for pid in "${done_logs[@]}"; do
    echo
    echo "======== ${session_name[$pid]} (ran beside the others; ${session_log[$pid]}) ========"
    cat "${session_log[$pid]}"
done
# Last, where a truncated log still shows them: every failure's first line
# (pytest's own summary cuts them at the terminal's width).
"$py" dev/failures.py "$logs"/{local-tiers,cluster-tier,e2e-tier}.xml
echo
echo "test sessions (run at once, $(awk -v s=$SECONDS 'BEGIN { printf "%.1f", s / 60 }') min in all):"
printf '%s\n' "${summary[@]}"
exit "$failed"
