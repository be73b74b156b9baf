#!/usr/bin/env bash
# Every committed simulation and plan in docs/results, regenerated from a clone (the results of
# `kvgate bench --compare` and `kvgate profile` are not here: they run the real stack, see
# docs/benchmarks.md). Then `python docs/render_results.py` puts the tables into the docs and
# `python bench/pool_sweep.py` builds the profile table and the load sweep (tables and charts).
#
#   docs/regenerate.sh [GROUP...]    groups: results plans sweep profiles load load-profiles seeds
#                                    (default: all of them, in that order), and pd (on request)
#   JOBS=N                           commands run N at a time (default 2)
#
# Each line is one command; all of them are deterministic (fixed seeds).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
S="kvgate simulate --jobs 1 --quiet"
P="kvgate plan --jobs 1"
SMALL_BANK=127.0.0.1:47087,127.0.0.1:35275,127.0.0.1:54327,127.0.0.1:41031
SMALL_BANK_EVENTS=127.0.0.1:29046,127.0.0.1:29047,127.0.0.1:29048,127.0.0.1:29049
SMALL_TRACE=127.0.0.1:43481,127.0.0.1:38383,127.0.0.1:54525,127.0.0.1:57761,127.0.0.1:58981,127.0.0.1:60245,127.0.0.1:50953,127.0.0.1:59737
TRACE=traces/mooncake_conversation_trace.jsonl.gz
DDR_MODES=affinity+ddr,round_robin+ddr,sticky+ddr,prefix-score,kv-cost,bounded-hash

group_results() {
    echo "$S --out docs/results"
    echo "$S --workload agentic-coding --out docs/results"
    echo "$S --workload agentic-coding --sessions 960 --out docs/results --name simulate-agentic-coding-960"
    echo "$S --fail 3@1800 --drain 5@1200 --out docs/results --name simulate-failover-bank-coding"
    echo "$S --pool-fail 1800@600 --out docs/results --name simulate-pool-fail-bank-coding"
    echo "$S --pool-hbm-multiple 1 --out docs/results --name simulate-small-pool-bank-coding"
    echo "$S --pool-slow 0@3600:0.25 --out docs/results --name simulate-slow-pool-bank-coding"
    echo "$S --context-sigma 1.0 --turns-mean 10 --out docs/results --name simulate-skewed-bank-coding"
    echo "$S --trace $TRACE --out docs/results"
    echo "$S --engines 4 --sessions 400 --duration-s 1800 --addresses $SMALL_BANK --out docs/results --name simulate-small-bank-coding"
    echo "$S --trace $TRACE --trace-limit 2000 --engines 8 --addresses $SMALL_TRACE --out docs/results --name simulate-small-mooncake-trace"
    echo "$S --engines 4 --sessions 400 --duration-s 1800 --modes affinity+ddr,sticky+ddr,round_robin+ddr --hbm-residency on --addresses $SMALL_BANK_EVENTS --out docs/results --name simulate-small-hbm-residency-bank-coding"
    echo "$S --modes affinity+ddr,round_robin+ddr,sticky+ddr,prefix-score --pool-residency on --out docs/results --name simulate-residency-bank-coding"
    echo "$S --modes affinity+ddr,round_robin+ddr,sticky+ddr,prefix-score --pool-residency on --pool-hbm-multiple 1 --out docs/results --name simulate-residency-small-pool-bank-coding"
    echo "$S --modes affinity+ddr,prefix-score --pool-residency on --workload agentic-coding --sessions 960 --out docs/results --name simulate-residency-agentic-coding-960"
    echo "$S --modes affinity+ddr,prefix-score --pool-residency on --pool-fail 1800@600 --out docs/results --name simulate-residency-pool-fail-bank-coding"
    echo "$S --modes affinity+ddr,prefix-score --hbm-residency on --workload agentic-coding --sessions 960 --out docs/results --name simulate-hbm-residency-agentic-coding-960"
    echo "$S --modes affinity+ddr,round_robin+ddr,sticky+ddr,prefix-score --hbm-residency on --out docs/results --name simulate-hbm-residency-bank-coding"
    echo "$S --modes affinity+ddr,prefix-score --hbm-residency on --pool-hbm-multiple 1 --out docs/results --name simulate-hbm-residency-small-pool-bank-coding"
    for n in 1440 1920; do
        echo "$S --modes affinity+ddr,prefix-score --hbm-residency on --workload agentic-coding --sessions $n --out docs/results --name simulate-hbm-residency-agentic-coding-$n"
    done
    echo "$S --modes affinity+ddr --hbm-residency on --sessions 12800 --out docs/results --name simulate-hbm-residency-bank-coding-12800"
    echo "kvgate simulate --jobs 2 --quiet --engines 1000 --sessions 100000 --block-size 512 --modes round_robin,ring_hash,affinity,round_robin+ddr,affinity+ddr,sticky+ddr --out docs/results --name simulate-fleet-1000-engines"
    echo "$S --trace traces/prefix_families_300.jsonl.gz --engines 4 --modes affinity+ddr,round_robin+ddr --gate-prefix-placement on --addresses 127.0.0.1:58447,127.0.0.1:48355,127.0.0.1:55837,127.0.0.1:41975 --out docs/results --name simulate-small-prefix-families"
}

group_plans() {
    echo "$P --engines 4,5,6,8,10,12,16 --out docs/results"
    echo "$P --mode sticky+ddr --engines 4,5,6,8,10,12,16 --out docs/results --name plan-sticky-ddr-bank-coding"
    echo "$P --mode round_robin+ddr --engines 4,5,6,8,10,12,16 --out docs/results --name plan-round-robin-ddr-bank-coding"
    echo "$P --mode round_robin --engines 16,24,32,36,40,48 --out docs/results --name plan-round-robin-bank-coding"
    echo "$P --engines 12 --ddr-tokens 5000000,10000000,20000000,50000000 --out docs/results --name plan-ddr-bank-coding"
    echo "$P --engines 16 --node-gbps 9,18,36,72,144 --out docs/results --name plan-bandwidth-affinity-ddr-bank-coding"
    echo "$P --engines 16 --node-gbps 9,18,36,72,144 --mode round_robin+ddr --out docs/results --name plan-bandwidth-round-robin-ddr-bank-coding"
    echo "$P --context-sigma 1.0 --turns-mean 10 --engines 6,8,10,12,16 --out docs/results --name plan-skewed-bank-coding"
    echo "$P --context-sigma 1.0 --turns-mean 10 --engines 6,8,10,12,16 --mode sticky+ddr --out docs/results --name plan-skewed-sticky-ddr-bank-coding"
}

group_sweep() {
    for e in 16 64 256; do for s in 1500 1000 500 0; do
        echo "$S --engines $e --system-tokens $s --modes round_robin,affinity+ddr --out docs/results/sweep --name sweep-$e-$s"
    done; done
}

# The key scenarios under the connector profiles other than the default (whose runs are the
# committed results above): the modes that use the pool.
group_profiles() {
    for c in lmcache mooncake vllm-offload; do
        local o="--pool-connector $c --modes $DDR_MODES --out docs/results/profiles"
        echo "$S $o --name bank-coding-$c"
        echo "$S --workload agentic-coding $o --name agentic-coding-480-$c"
        echo "$S --workload agentic-coding --sessions 960 $o --name agentic-coding-960-$c"
        echo "$S --pool-hbm-multiple 1 $o --name small-pool-bank-coding-$c"
        echo "$S --pool-fail 1800@600 $o --name pool-fail-bank-coding-$c"
        echo "$S --trace $TRACE $o --name mooncake-trace-$c"
    done
}

# The load sweep, default profile, every mode, 0.5x to 4x the default load (480 and 960 agentic
# sessions and the default bank-coding load, 3,200, are the committed results above).
group_load() {
    for n in 240 1440 1920; do
        echo "$S --workload agentic-coding --sessions $n --out docs/results/load --name agentic-coding-$n"
    done
    for n in 1600 6400 9600 12800; do
        echo "$S --sessions $n --out docs/results/load --name bank-coding-$n"
    done
}

# ... and under the other profiles, for kvgate, round robin with the pool and prefix-score.
group_load_profiles() {
    for c in lmcache mooncake vllm-offload; do
        local o="--pool-connector $c --modes affinity+ddr,round_robin+ddr,prefix-score --out docs/results/load"
        for n in 240 480 960 1440 1920; do
            echo "$S --workload agentic-coding --sessions $n $o --name agentic-coding-$n-$c"
        done
        for n in 1600 3200 6400 9600 12800; do
            echo "$S --sessions $n $o --name bank-coding-$n-$c"
        done
    done
}

# agentic-coding at 960 sessions under other workload seeds (the committed runs above are seed
# 0): how far one seed's figures are from another's.
group_seeds() {
    for seed in 1 2 3; do
        local o="--workload agentic-coding --sessions 960 --seed $seed --out docs/results/seeds"
        echo "$S $o --modes affinity+ddr,sticky+ddr,prefix-score --name agentic-coding-960-seed-$seed"
        echo "$S $o --modes affinity+ddr --hbm-residency on --name hbm-residency-agentic-coding-960-seed-$seed"
    done
}

# Prefill/decode fleets on 16 devices (`--pd P:D`): colocated kvgate (affinity+ddr) and the
# four P/D policies, at the default and twice the default load. Not in the default list: about
# 4 minutes a run (1 for the pd-kvgate-only ones). KV events on (`--hbm-residency on`): the peers' P/D routers use them too.
group_pd() {
    local o="--modes pd --hbm-residency on --out docs/results/pd"
    for split in 4:12 8:8; do
        local n="pd-${split/:/-}"
        echo "$S --pd $split $o --name $n-bank-coding"
        echo "$S --pd $split --sessions 6400 $o --name $n-bank-coding-6400"
        echo "$S --pd $split --workload agentic-coding $o --name $n-agentic-coding"
        echo "$S --pd $split --workload agentic-coding --sessions 960 $o --name $n-agentic-coding-960"
        # pd-kvgate with every turn prefilled remotely (skip_prefill_below 0), beside the default
        local k="--modes pd-kvgate --skip-prefill-below 0 --hbm-residency on --no-oracle --out docs/results/pd"
        echo "$S --pd $split $k --name $n-bank-coding-skip-0"
        echo "$S --pd $split --workload agentic-coding $k --name $n-agentic-coding-skip-0"
        echo "$S --pd $split --sessions 6400 $k --name $n-bank-coding-6400-skip-0"
        echo "$S --pd $split --workload agentic-coding --sessions 960 $k --name $n-agentic-coding-960-skip-0"
        # pd-kvgate with disaggregation.skip_rule streams (kvgate/pd/skip_price.py)
        local t="--modes pd-kvgate --skip-rule streams --hbm-residency on --no-oracle --out docs/results/pd"
        echo "$S --pd $split $t --name $n-bank-coding-streams"
        echo "$S --pd $split --workload agentic-coding $t --name $n-agentic-coding-streams"
        echo "$S --pd $split --workload agentic-coding --sessions 960 $t --name $n-agentic-coding-960-streams"
        echo "$S --pd $split --sessions 6400 $t --name $n-bank-coding-6400-streams"
        # the Mooncake conversation trace (12,031 requests)
        echo "$S --trace $TRACE --pd $split $o --name $n-mooncake-trace"
        echo "$S --trace $TRACE --pd $split $k --name $n-mooncake-trace-skip-0"
        echo "$S --trace $TRACE --pd $split $t --name $n-mooncake-trace-streams"
    done
    # the pool under P/D per connector profile (ascend-store is the runs above): bank-coding 8:8
    for c in lmcache mooncake vllm-offload; do
        echo "$S --pd 8:8 --modes pd-kvgate,pd-vllm-ascend --pool-connector $c --hbm-residency on --no-oracle --out docs/results/pd --name pd-8-8-bank-coding-pool-$c"
    done
    # `kvgate plan --pd`: the smallest P/D fleet and split meeting TTFT p99 10 s and ITL p99
    # 100 ms (12 runs, about 3 minutes)
    echo "$P --pd --engines 8,12,16 --prefill-shares 0.25,0.375,0.5,0.625 --itl-p99 0.1 --hbm-residency on --out docs/results/pd --name plan-pd-bank-coding"
}

groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(results plans sweep profiles load load-profiles seeds)
for g in "${groups[@]}"; do
    "group_${g//-/_}"
done | xargs -P "$JOBS" -I{} sh -c 'echo "+ {}" >&2; {} > /dev/null'
