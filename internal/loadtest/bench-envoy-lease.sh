#!/usr/bin/env bash
# Leased quotas on the Envoy RLS path: `sluice serve` on Redis, one hot
# descriptor value at 64 concurrent gRPC calls, under its limit without and
# with `lease: true`, then over its limit with it; Redis script calls per
# request from INFO commandstats. Only 127.0.0.1 is targeted.
#
#   bash internal/loadtest/bench-envoy-lease.sh [duration]     # default 10s
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
mkdir -p "$WORK/rls"
cat >"$WORK/rls/hot.yaml" <<YAML
domain: hot
descriptors:
  - {key: k, rate_limit: {unit: second, requests_per_unit: 100000000, algorithm: gcra}}
YAML
cat >"$WORK/rls/hotlease.yaml" <<YAML
domain: hotlease
descriptors:
  - {key: k, rate_limit: {unit: second, requests_per_unit: 100000000, algorithm: gcra, lease: true}}
YAML
cat >"$WORK/rls/over.yaml" <<YAML
domain: over
descriptors:
  - {key: k, rate_limit: {unit: second, requests_per_unit: 1000, algorithm: gcra, lease: true}}
YAML
GPORT=$(freeport); HPORT=$(freeport)
cat >"$WORK/sluice.yaml" <<YAML
listen: "127.0.0.1:$HPORT"
store:
  url: redis://127.0.0.1:$RPORT/0
  timeout: 1s
envoy:
  grpc_addr: "127.0.0.1:$GPORT"
  config_dir: $WORK/rls
YAML
"$WORK/sluice" serve --config "$WORK/sluice.yaml" >"$WORK/serve.log" 2>&1 &
SPID=$!
PIDS+=($SPID)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$HPORT/healthz" >/dev/null && break; sleep 0.1; done
echo "# $(date -u +%FT%TZ) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for domain in hot hotlease over; do
  echo "## domain $domain: one descriptor value, sluice loadtest --grpc -c 64 -d $DUR"
  redis-cli -p "$RPORT" config resetstat >/dev/null
  "$WORK/sluice" loadtest --grpc "127.0.0.1:$GPORT" --domain "$domain" --descriptor 'k=one' \
    -c 64 -d "$DUR" --pid "$SPID"
  redis-cli -p "$RPORT" info commandstats | grep -E 'evalsha|eval:' || echo "no script calls"
done
