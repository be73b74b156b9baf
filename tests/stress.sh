#!/usr/bin/env bash
# The README's test command, run several times in a row while busy processes keep the cores
# busy: the suite must stay green on a loaded machine, not only on a quiet one.
#
#   tests/stress.sh [RUNS] [-- PYTEST_ARGS...]
#
#   RUNS            runs in a row (default $STRESS_RUNS or 3); stops at the first failing run
#   PYTEST_ARGS     instead of the whole suite, e.g. `tests/stress.sh 5 -- tests/gateway -x`
#   STRESS_BURNERS  busy processes alongside (default 2: both cores of the reference machine)
#   PYTHON          the interpreter (default: `python` on PATH, i.e. the active virtualenv)
#
# Prints each run's result and wall time; exits with the failing run's pytest status, or 2 on
# bad usage. The busy processes are stopped however the script ends.
set -u

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
    exit 2
}

runs=${STRESS_RUNS:-3}
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    runs=$1
    shift
fi
if [ $# -gt 0 ]; then
    [ "$1" = "--" ] || usage
    shift
fi
burners=${STRESS_BURNERS:-2}
python=${PYTHON:-python}
case $runs in '' | *[!0-9]* | 0) echo "stress.sh: RUNS must be a positive integer, got '$runs'" >&2; usage ;; esac
case $burners in '' | *[!0-9]*) echo "stress.sh: STRESS_BURNERS must be an integer, got '$burners'" >&2; usage ;; esac
command -v "$python" > /dev/null || { echo "stress.sh: no '$python' on PATH: activate the virtualenv or set PYTHON" >&2; exit 2; }

cd "$(dirname "$0")/.." || exit 2

pids=()
stop_burners() {
    [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2> /dev/null
    [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}" 2> /dev/null
    pids=()
}
trap stop_burners EXIT
trap 'stop_burners; exit 130' INT
trap 'stop_burners; exit 143' TERM

for _ in $(seq "$burners"); do
    # A shell busy loop: pure CPU, no I/O, one core each.
    sh -c 'while :; do :; done' &
    pids+=($!)
done
echo "stress.sh: $runs run(s) of '$python -m pytest -q $*' beside $burners busy process(es)" \
    "(pids ${pids[*]:-none}) on $(nproc) core(s)"

started=$(date +%s)
for run in $(seq "$runs"); do
    begin=$(date +%s)
    "$python" -m pytest -q "$@"
    status=$?
    took=$(( $(date +%s) - begin ))
    if [ $status -ne 0 ]; then
        echo "stress.sh: run $run/$runs FAILED (pytest exit $status) after ${took} s"
        exit $status
    fi
    echo "stress.sh: run $run/$runs passed in ${took} s"
done
echo "stress.sh: all $runs run(s) passed in $(( $(date +%s) - started )) s"
