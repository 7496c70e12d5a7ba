#!/usr/bin/env bash
# Service throughput benchmark: `sluice loadtest` at 64 connections against
# `sluice serve` on the memory store and on Redis, next to the in-process
# store rate measured in the same run (go test -bench), plus the service's
# own CPU time per decision (from /proc), which the load generator sharing
# the machine does not distort.
#
#   bash internal/loadtest/bench-service.sh [duration]      # default 10s
#
# It starts its own redis-server on a free loopback port and stops
# everything it started on exit. Only 127.0.0.1 is targeted.
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR=${1:-10s}
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cputicks() { awk '{print $14+$15}' "/proc/$1/stat"; }
waitup() { for _ in $(seq 100); do curl -sf "http://127.0.0.1:$1/healthz" >/dev/null && return 0; sleep 0.1; done; echo "service on :$1 did not start" >&2; exit 1; }

go build -o "$WORK/sluice" ./cmd/sluice
RPORT=$(freeport)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

echo "# $(date -u +%FT%TZ) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## in-process: store call vs HTTP round trip (client in the same process), 64 goroutines (go test -bench)"
go test -run '^$' -bench 'Decision' -benchtime 5s ./internal/server | grep Benchmark

for store in memory "redis://127.0.0.1:$RPORT/0"; do
	PORT=$(freeport)
	cat >"$WORK/bench.yaml" <<YAML
listen: "127.0.0.1:$PORT"
store: {url: "$store", failure_policy: fail_open, timeout: 1s}
policies:
  bench: {algorithm: gcra, limit: 1000000/s}
YAML
	"$WORK/sluice" serve --config "$WORK/bench.yaml" --log-level warn >"$WORK/serve.log" 2>&1 &
	SPID=$!
	PIDS+=($SPID)
	waitup "$PORT"
	"$WORK/sluice" loadtest --url "http://127.0.0.1:$PORT/v1/check" -c 64 -d 2s --body '{"policy":"bench","key":"user-{key}"}' --keys 10000 >/dev/null # warm-up
	T0=$(cputicks $SPID)
	echo "## sluice serve, store ${store%%:*}, sluice loadtest -c 64 -d $DUR, 10000 keys"
	"$WORK/sluice" loadtest --url "http://127.0.0.1:$PORT/v1/check" -c 64 -d "$DUR" --body '{"policy":"bench","key":"user-{key}"}' --keys 10000 | tee "$WORK/lt.txt"
	T1=$(cputicks $SPID)
	REQS=$(awk '/^requests/{print $2}' "$WORK/lt.txt")
	echo "service CPU: $(( (T1-T0) * 10 )) ms for $REQS decisions = $(awk -v t=$(( (T1-T0) * 10 )) -v n="$REQS" 'BEGIN{printf "%.1f", t*1000/n}') µs/decision"
	kill $SPID
	wait $SPID 2>/dev/null || true
done
