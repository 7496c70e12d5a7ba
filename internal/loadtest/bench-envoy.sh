#!/usr/bin/env bash
# Envoy RLS benchmark: `sluice loadtest --grpc` at 64 concurrent calls with
# 100k distinct descriptor values against `sluice serve` with an envoy:
# section, on the memory store and on Redis, with the server's CPU per
# request read from /proc. Only 127.0.0.1 is targeted.
#
#   bash internal/loadtest/bench-envoy.sh [duration]     # default 10s
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR=${1:-10s}
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

go build -o "$WORK/sluice" ./cmd/sluice
RPORT=$(freeport)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
echo "# $(date -u +%FT%TZ) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for store in memory "redis://127.0.0.1:$RPORT/0"; do
  GPORT=$(freeport); HPORT=$(freeport)
  cat >"$WORK/sluice.yaml" <<YAML
listen: "127.0.0.1:$HPORT"
store:
  url: $store
  timeout: 1s
envoy:
  grpc_addr: "127.0.0.1:$GPORT"
  config_dir: $PWD/deploy/envoy/ratelimit
YAML
  "$WORK/sluice" serve --config "$WORK/sluice.yaml" >"$WORK/serve.log" 2>&1 &
  SPID=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$HPORT/healthz" >/dev/null && break; sleep 0.1; done
  echo "## store ${store%%://*}, sluice loadtest --grpc -c 64 -d $DUR, 100000 descriptor values"
  [ "${store%%://*}" = redis ] && redis-cli -p "$RPORT" config resetstat >/dev/null
  "$WORK/sluice" loadtest --grpc "127.0.0.1:$GPORT" --domain edge --descriptor 'remote_address=10.0.{key}' \
    -c 64 -d "$DUR" --keys 100000 --pid "$SPID"
  [ "${store%%://*}" = redis ] && redis-cli -p "$RPORT" info commandstats | grep -E 'evalsha|eval:' || true
  kill "$SPID"; wait "$SPID" 2>/dev/null || true
done
