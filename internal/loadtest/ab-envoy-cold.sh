#!/usr/bin/env bash
# A/B of sluice builds on the Envoy cold-key load, interleaved with the
# gRPC floor (rlsfloor), each round: floor, then every build in turn, each
# `serve` on its own flushed redis-server database with plain_windows, 64
# in flight on 100 000 keys (as bench-envoy-cold.sh's "plain" phase).
# Prints per phase the server's CPU per request (/proc, `sluice loadtest
# --pid`) and its read and write system calls per request (/proc/PID/io):
# the calls per request are steadier than the CPU on a shared machine and
# show how well the requests share reads and writes.
#
#   go build -o /tmp/a ./cmd/sluice; (change something) go build -o /tmp/b ./cmd/sluice
#   DUR=6s ROUNDS=3 bash internal/loadtest/ab-envoy-cold.sh /tmp/a /tmp/b
#
# A build may be a wrapper script (e.g. one that sets GOGC) around a binary.
# The first build also runs the load. Only 127.0.0.1 is targeted.
set -uo pipefail
cd "$(dirname "$0")/../.."
DUR=${DUR:-6s}
ROUNDS=${ROUNDS:-3}
BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || { echo "usage: $0 SLUICE_BINARY..." >&2; exit 2; }
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$WORK"; }
trap cleanup EXIT
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
go build -o "$WORK/rlsfloor" ./internal/loadtest/cmd/rlsfloor
RPORT=$(freeport)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
io() { awk '/^sysc[rw]/ {printf "%s ", $2}' "/proc/$1/io"; }

# run NAME BIN starts BIN serve (or rlsfloor when BIN is "floor"), loads
# it and prints its figures.
run() {
  local name=$1 bin=$2 gport hport spid io0 io1 req cpu
  gport=$(freeport); hport=$(freeport)
  if [ "$bin" = floor ]; then
    "$WORK/rlsfloor" -addr "127.0.0.1:$gport" &
    spid=$!
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$gport") 2>/dev/null && break; sleep 0.1; done
  else
    redis-cli -p "$RPORT" flushall sync >/dev/null
    cat >"$WORK/s.yaml" <<YAML
listen: "127.0.0.1:$hport"
store:
  url: redis://127.0.0.1:$RPORT/0
  timeout: 1s
  plain_windows: true
envoy:
  grpc_addr: "127.0.0.1:$gport"
  config_dir: $PWD/deploy/envoy/ratelimit
YAML
    "$bin" serve --config "$WORK/s.yaml" >/dev/null 2>&1 &
    spid=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$hport/healthz" >/dev/null && break; sleep 0.1; done
  fi
  PIDS+=($spid)
  io0=$(io "$spid")
  "${BINS[0]}" loadtest --grpc "127.0.0.1:$gport" --domain edge --descriptor 'remote_address=10.0.{key}' \
    -c 64 -d "$DUR" --keys 100000 --pid "$spid" >"$WORK/out"
  io1=$(io "$spid")
  req=$(awk '/^requests/ {print $2}' "$WORK/out")
  cpu=$(awk '/^server cpu/ {print $3}' "$WORK/out")
  python3 - "$name" "$req" "$cpu" "$io0" "$io1" <<'PY'
import re, sys
name, req, cpu, a, b = sys.argv[1:]
req = int(req)
secs = sum(float(v) * {'h': 3600, 'm': 60, 's': 1, 'ms': 1e-3, 'µs': 1e-6, 'us': 1e-6, 'ns': 1e-9}[u]
           for v, u in re.findall(r'([0-9.]+)(h|ms|µs|us|ns|m|s)', cpu))
a, b = list(map(int, a.split())), list(map(int, b.split()))
print(f"{name:10s} requests {req:7d}  cpu/request {secs / req * 1e6:6.1f} µs  reads/request {(b[0] - a[0]) / req:.3f}  writes/request {(b[1] - a[1]) / req:.3f}", flush=True)
PY
  kill "$spid"; wait "$spid" 2>/dev/null
}

for r in $(seq "$ROUNDS"); do
  echo "# round $r, load average $(cut -d' ' -f1 /proc/loadavg)"
  run floor floor
  for b in "${BINS[@]}"; do run "$(basename "$b")" "$b"; done
done
