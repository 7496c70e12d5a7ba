#!/usr/bin/env bash
# bench/redis-callgrind.sh LUA ARGS [NKEYS] [N]: Redis instructions per
# EVALSHA of the script in file LUA, redis-server under valgrind's
# callgrind (the event loop and I/O included), driven by redis-benchmark
# -c 16 -P 16 over 10,000 random keys: 20,000 calls to warm the keys, then
# the counters zeroed and N (10,000) calls counted. ARGS is a file of the
# ARGV, shell-quoted on one line; NKEYS (1) keys per call, each random. A
# count of instructions repeats to ±0.2% on a shared machine, where
# INFO commandstats' usec_per_call (wall time) moved 2× between runs.
# docs/BENCHMARKS.md (Redis store and leases, redisperf) lists the
# figures; print a script and its ARGV with redisstore.Script.
set -euo pipefail
lua=${1:?usage: bench/redis-callgrind.sh LUA ARGS [NKEYS] [N]}
argsf=${2:?usage: bench/redis-callgrind.sh LUA ARGS [NKEYS] [N]}
nkeys=${3:-1}
n=${4:-10000}
dir=$(mktemp -d "${TMPDIR:-/tmp}/redis-callgrind.XXXXXX")
port=$((20000 + RANDOM % 20000))
while redis-cli -p "$port" ping >/dev/null 2>&1; do port=$((20000 + RANDOM % 20000)); done
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" redis-server --port "$port" --save '' --appendonly no --dir "$dir" >"$dir/log" 2>&1 &
vpid=$!
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; wait "$vpid" 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 300); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$lua")")
eval "args=($(cat "$argsf"))"
keys=()
for _ in $(seq "$nkeys"); do keys+=("rate:user:__rand_int__"); done
bench() { redis-benchmark -p "$port" -c 16 -P 16 -r 10000 -n "$1" -q EVALSHA "$sha" "$nkeys" "${keys[@]}" "${args[@]}" >/dev/null; }
bench 20000
callgrind_control -z "$vpid" >/dev/null
bench "$n"
callgrind_control -d "$vpid" >/dev/null
total=$(grep -h -m1 '^summary:\|^totals:' "$dir"/cg.out.* | awk '{print $2}')
echo "$(basename "$lua"): $((total / n)) instructions per call, $((total / n / nkeys)) per key"
