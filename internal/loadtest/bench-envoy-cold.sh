#!/usr/bin/env bash
# Envoy RLS on 100k cold keys: sluice beside envoyproxy/ratelimit (ERL) and
# against two floors, all measured in the same run:
#
#  - the gRPC floor: rlsfloor (internal/loadtest/cmd/rlsfloor), the server
#    `sluice serve` builds (envoyrls.NewGRPCServerFor) with a handler that
#    answers OK and asks no store (the empty RateLimitService handler);
#  - the Redis floor: incrload (internal/loadtest/cmd/incrload), a bare
#    pipelined INCRBY + PEXPIRE per decision on the same keys through the
#    rueidis client redisstore builds, against the same redis-server.
#
# The load: 64 in flight on 100000 values of one descriptor
# (remote_address=10.0.{key}) whose limit is 100 per SECOND, a fixed
# window, as one ratelimit config file that sluice and ERL both read: with
# 1 s windows nearly every request counts in a key new in its window.
#
# The six services run side by side for the whole benchmark, each on its
# own port (the Redis ones each on its own database of one redis-server),
# and the load goes to one at a time, in slices of $SLICE (2s): a round
# gives each service DURATION in DURATION/SLICE slices, taking them in
# turn, the order rotating by one each turn (floor, redis, erl, memory,
# scripts, floorgc; then redis, erl, memory, scripts, floorgc, floor; ...).
# Other engineers' builds and tests come and go within seconds on this
# shared machine: a service loaded for 10 s in one go could meet a quiet
# machine and the next one a crowded one, which moved a round's req/s
# ratio by 2× (see docs/BENCHMARKS.md); in short alternating slices they
# meet the same crowd. Each service's figures are summed over its slices of the round:
#   floor      rlsfloor, as fast as it goes
#   redis      `sluice serve` on Redis, default settings (plain windows)
#   erl        envoyproxy/ratelimit on the same Redis, when $ERL_BIN names
#              its binary (built from its source outside this repository:
#              see docs/BENCHMARKS.md); skipped when unset
#   memory     `sluice serve` on the memory store
#   scripts    `sluice serve` on Redis with store.plain_windows: false
#              (every decision a script)
#   floorgc    rlsfloor with GOGC=400. The empty handler's live heap is
#              about 1 MB, so Go's collector runs at its 4 MB minimum goal,
#              some 75 times a second under this load (GODEBUG=gctrace=1):
#              half the floor's CPU per request. sluice serve holds some
#              13 MB and collects every ~2000 requests; at GOGC=400 the
#              floor collects every ~3000, about as often per request, so
#              it is the gRPC cost without the collector's toll on a tiny
#              heap (the issue's target stays against the plain floor).
# then, unless REDIS_FLOORS=0, the Redis floors, each DURATION in one go:
#   floorrate  rlsfloor again, paced at the req/s sluice reached on Redis
#              (--grpc-rate)
#   bare       incrload, as fast as it goes
#   barerate   incrload paced at sluice's req/s on Redis (-rate)
#   lua        incrload -lua: the same pair inside one minimal script, the
#              floor of any script-based decision
#   script     incrload -sluice: sluice's own fixed-window script, EVALSHA
#              as fast as the bare pairs go (its cost apart from batching)
# Every phase's load is the same `sluice loadtest --grpc` (64 streams on 4
# HTTP/2 connections, the same keys), which reports its own CPU per request
# too: it shares the cores with the server it loads, so its cost per
# request is a fixed cost that pulls every req/s ratio toward 1; the
# summary shows each service's CPU per request beside it (load generator +
# service + Redis), which is what its req/s on 2 shared cores follows.
# The summary prints, per round, the issue's ratios: sluice's req/s ÷
# ERL's, service CPU per request ÷ the empty handler's (sluice on memory,
# on Redis, ERL), and Redis CPU per request ÷ ERL's, each with the load
# average at the phase's start, then the median [min–max] over the rounds.
# A server's CPU per request falls as more requests share a read or a
# write, so a floor at full speed is one that a slower server cannot reach:
# the paced floors compare at one rate. Service CPU per request is read
# from /proc/PID/stat by `sluice loadtest --pid`; Redis CPU from
# redis-server's /proc/PID/stat (utime+stime) and from INFO commandstats
# (usec: wall time inside commands, inflated when the CPU is contended).
# The target's measure is /proc: per decision means per request for sluice
# and ERL and per INCRBY+PEXPIRE pair for the floor. The database is
# flushed before each Redis phase. Only 127.0.0.1 is targeted.
#
#   ERL_BIN=/path/to/ratelimit bash internal/loadtest/bench-envoy-cold.sh [duration] [rounds]   # 10s 3
#   REDIS_FLOORS=0 ...   # only the empty handler, memory, redis, erl and scripts: more rounds in the time
#   SLICE=2s ...         # the length of one slice of load (DURATION a multiple of it)
#   ERL_COMMIT=abc1234   # ERL's commit for the header (default: read from the git work tree that holds ERL_BIN)
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR=${1:-10s}
ROUNDS=${2:-3}
SLICE=${SLICE:-2s}
case "$DUR$SLICE" in *s*s) ;; *) echo "duration and SLICE are whole seconds, such as 10s" >&2; exit 2 ;; esac
NSLICES=$((${DUR%s} / ${SLICE%s}))
[ "$NSLICES" -ge 1 ] && [ $((${DUR%s} % ${SLICE%s})) = 0 ] || { echo "duration $DUR is not a multiple of a slice ($SLICE)" >&2; exit 2; }
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
LOAD_RATE=()
LOAD=(--domain edge --descriptor 'remote_address=10.0.{key}' -c 64 -d "$SLICE" --keys 100000)
ERL_BIN=${ERL_BIN:-}
REDIS_FLOORS=${REDIS_FLOORS:-1} # 0 skips floorrate, bare, barerate, lua and script
if [ -n "$ERL_BIN" ] && [ ! -x "$ERL_BIN" ]; then echo "ERL_BIN=$ERL_BIN is not an executable; skipping envoyproxy/ratelimit" >&2; ERL_BIN=; fi
# The one ratelimit config both services read (ERL from
# RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config).
mkdir -p "$WORK/erl/ratelimit/config"
cat >"$WORK/erl/ratelimit/config/edge.yaml" <<YAML
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 100
YAML

go build -o "$WORK/sluice" ./cmd/sluice
go build -o "$WORK/rlsfloor" ./internal/loadtest/cmd/rlsfloor
go build -o "$WORK/incrload" ./internal/loadtest/cmd/incrload
RPORT=$(freeport)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
RPID=$!
PIDS+=($RPID)
for _ in $(seq 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
RURL="redis://127.0.0.1:$RPORT/0"
if [ -n "$ERL_BIN" ] && [ -z "${ERL_COMMIT:-}" ]; then ERL_COMMIT=$(git -C "$(dirname "$ERL_BIN")" rev-parse --short HEAD 2>/dev/null || true); fi
echo "# $(date -u +%FT%TZ) $(nproc) cores ($(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)), load average $(cut -d' ' -f1-3 /proc/loadavg), $(redis-server --version | cut -d' ' -f1-3), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?), ERL: ${ERL_BIN:-none}${ERL_COMMIT:+ at $ERL_COMMIT}"

# redis_before / redis_after bracket a slice or phase: reset INFO, read
# CPU; redis_before flush also empties every database first.
redis_before() {
  [ "${1:-}" != flush ] || redis-cli -p "$RPORT" flushall sync >/dev/null
  redis-cli -p "$RPORT" config resetstat >/dev/null
  T0=$(ticks "$RPID")
}
# redis_after prints the phase's INFO commandstats lines and appends
# "cpu_s usec calls" to $WORK/results: usec and calls count the commands
# clients sent. A script's usec includes the commands it calls, which
# commandstats also lists on their own lines (TIME, GET, SET); those are
# left out of the sum while scripts ran.
redis_after() {
  local t1
  t1=$(ticks "$RPID")
  redis-cli -p "$RPORT" info commandstats | tr -d '\r' | grep -vE '^cmdstat_(config|flushall|info)[:|]' | grep '^cmdstat_' | sed 's/^/  /' || true
  # The commands a script runs (at most one TIME, one GET and one SET or
  # DEL each, as sluice's fixed-window scripts) are counted inside its
  # EVALSHA and again on their own lines: up to one of each per script
  # call is left out, so that a phase mixing plain commands and scripts
  # (the plain path near window boundaries) counts what clients sent.
  redis-cli -p "$RPORT" info commandstats | tr -d '\r' |
    awk -F'[:=,]' -v cpu="$(awk -v a="$T0" -v b="$t1" -v hz="$HZ" 'BEGIN {printf "%.3f", (b-a)/hz}')" '
      /^cmdstat_/ { n=substr($1, 9); if (n ~ /^(config|flushall|info)$/) next; calls[n]=$3; usec[n]=$5; if (n ~ /^(eval|evalsha|evalsha_ro|eval_ro|fcall)$/) scripts+=$3 }
      END { left=scripts
            for (n in calls) { k=calls[n]; x=0
              if (n == "time" || n == "get") x=(k < scripts ? k : scripts)
              else if (n == "set" || n == "del") { x=(k < left ? k : left); left-=x }
              c+=k-x; if (k > 0) u+=usec[n]*(k-x)/k }
            printf " %s %d %d", cpu, u, c }' >>"$WORK/results"
  # Reads: how many reads Redis's event loop made (1/reads per command is
  # the depth of the pipelines it was sent).
  redis-cli -p "$RPORT" info stats | tr -d '\r' | awk -F: '/^total_reads_processed:/ {printf " %s\n", $2}' >>"$WORK/results"
}

# serve_sluice NAME STORE_URL [PLAIN] starts `sluice serve` and sets SPID
# and GPORT; PLAIN, when given (true or false), is store.plain_windows,
# else the default.
serve_sluice() {
  local name=$1; shift
  GPORT=$(freeport); local hport; hport=$(freeport)
  cat >"$WORK/sluice-$name.yaml" <<YAML
listen: "127.0.0.1:$hport"
store:
  url: $1
  timeout: 1s
${2:+  plain_windows: $2}
envoy:
  grpc_addr: "127.0.0.1:$GPORT"
  config_dir: $WORK/erl/ratelimit/config
YAML
  "$WORK/sluice" serve --config "$WORK/sluice-$name.yaml" >"$WORK/serve-$name.log" 2>&1 &
  SPID=$!
  PIDS+=($SPID)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$hport/healthz" >/dev/null && break; sleep 0.1; done
}

# loadtest NAME runs the gRPC load against GPORT, server SPID, and records
# "round name requests server_cpu_s" in $WORK/results (Redis figures added
# by the caller), and "round name client_cpu_s load_average" in
# $WORK/extra: one line per slice, summed by the summary.
loadtest() {
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  "$WORK/sluice" loadtest --grpc "127.0.0.1:$GPORT" "${LOAD[@]}" "${LOAD_RATE[@]}" --pid "$SPID" | tee "$WORK/out"
  local req cpu
  req=$(awk '/^requests/ {print $2}' "$WORK/out")
  cpu=$(awk '/^server cpu/ {print $3}' "$WORK/out")
  printf '%s %s %s %s' "$round" "$1" "$req" "$cpu" >>"$WORK/results"
  printf '%s %s %s %s\n' "$round" "$1" "$(awk '/^client cpu/ {print $3}' "$WORK/out")" "$load" >>"$WORK/extra"
}

# serve_erl starts envoyproxy/ratelimit ($ERL_BIN) on Redis with its
# defaults (no local cache, no statsd) and sets SPID and GPORT.
serve_erl() {
  GPORT=$(freeport); local hport dport; hport=$(freeport); dport=$(freeport)
  env -i PATH="$PATH" HOST=127.0.0.1 PORT="$hport" GRPC_HOST=127.0.0.1 GRPC_PORT="$GPORT" \
    DEBUG_HOST=127.0.0.1 DEBUG_PORT="$dport" USE_STATSD=false LOG_LEVEL=error \
    RUNTIME_ROOT="$WORK/erl" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
    REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RPORT" \
    "$ERL_BIN" >"$WORK/erl.log" 2>&1 &
  SPID=$!
  PIDS+=($SPID)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$hport/healthcheck" >/dev/null && break; sleep 0.1; done
}

# serve_floor [GOGC] starts rlsfloor and sets SPID and GPORT.
serve_floor() {
  GPORT=$(freeport)
  env ${1:+GOGC=$1} "$WORK/rlsfloor" -addr "127.0.0.1:$GPORT" &
  SPID=$!
  PIDS+=($SPID)
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$GPORT") 2>/dev/null && break; sleep 0.1; done
}

: >"$WORK/results"
: >"$WORK/extra"
# All five up at once: SP and GP map a service to its process and port.
declare -A SP GP
serve_floor; SP[floor]=$SPID; GP[floor]=$GPORT
serve_floor 400; SP[floorgc]=$SPID; GP[floorgc]=$GPORT
serve_sluice memory memory; SP[memory]=$SPID; GP[memory]=$GPORT
serve_sluice redis "redis://127.0.0.1:$RPORT/1"; SP[redis]=$SPID; GP[redis]=$GPORT
serve_sluice scripts "redis://127.0.0.1:$RPORT/2" false; SP[scripts]=$SPID; GP[scripts]=$GPORT
PHASES=(floor redis erl memory scripts floorgc)
if [ -n "$ERL_BIN" ]; then
  serve_erl; SP[erl]=$SPID; GP[erl]=$GPORT # ERL's REDIS_URL has no database: 0
else
  PHASES=(floor redis memory scripts floorgc)
fi
declare -A TITLE=([floor]="gRPC floor (rlsfloor, no store)" [floorgc]="gRPC floor, GOGC=400" [memory]="sluice serve, memory store"
  [redis]="sluice serve, Redis, default settings" [erl]="envoyproxy/ratelimit, Redis"
  [scripts]="sluice serve, Redis, store.plain_windows: false (scripts)")

# slice NAME loads one service for one slice.
slice() {
  SPID=${SP[$1]} GPORT=${GP[$1]}
  echo "## round $round, slice $s: ${TITLE[$1]}, load average $(cut -d' ' -f1 /proc/loadavg)"
  case $1 in
  floor | floorgc | memory) loadtest "$1"; echo " - - -" >>"$WORK/results" ;;
  *) redis_before; loadtest "$1"; redis_after ;;
  esac
}

for round in $(seq "$ROUNDS"); do
  redis-cli -p "$RPORT" flushall sync >/dev/null
  for s in $(seq "$NSLICES"); do
    for i in "${!PHASES[@]}"; do
      slice "${PHASES[$(((i + round + s - 2) % ${#PHASES[@]}))]}"
    done
  done
  # sluice's req/s on Redis in this round, for the paced floors.
  RATE=$(awk -v r="$round" -v d="${DUR%s}" '$1 == r && $2 == "redis" {n += $3} END {printf "%.0f", n / d}' "$WORK/results")

  [ "$REDIS_FLOORS" = 1 ] || continue
  echo "## round $round: gRPC floor at sluice's rate on Redis in this round ($RATE/s, --grpc-rate), load average $(cut -d' ' -f1 /proc/loadavg)"
  SPID=${SP[floor]} GPORT=${GP[floor]}
  LOAD_RATE=(--grpc-rate "$RATE")
  LOAD[${#LOAD[@]}-3]=$DUR # -d: the whole duration
  loadtest floorrate; echo " - - -" >>"$WORK/results"
  LOAD_RATE=()
  LOAD[${#LOAD[@]}-3]=$SLICE

  echo "## round $round: bare pipelined INCRBY + PEXPIRE (incrload), load average $(cut -d' ' -f1 /proc/loadavg)"
  redis_before flush
  "$WORK/incrload" -url "$RURL" -c 64 -d "$DUR" -keys 100000 | tee "$WORK/out"
  printf '%s bare %s -' "$round" "$(awk '/^pairs/ {print $2}' "$WORK/out")" >>"$WORK/results"
  redis_after

  echo "## round $round: bare INCRBY + PEXPIRE at sluice's rate on Redis in this round ($RATE/s, incrload -rate), load average $(cut -d' ' -f1 /proc/loadavg)"
  redis_before flush
  "$WORK/incrload" -url "$RURL" -c 64 -d "$DUR" -keys 100000 -rate "$RATE" | tee "$WORK/out"
  printf '%s barerate %s -' "$round" "$(awk '/^pairs/ {print $2}' "$WORK/out")" >>"$WORK/results"
  redis_after

  echo "## round $round: the same pair in one minimal Lua script (incrload -lua), load average $(cut -d' ' -f1 /proc/loadavg)"
  redis_before flush
  "$WORK/incrload" -url "$RURL" -c 64 -d "$DUR" -keys 100000 -lua | tee "$WORK/out"
  printf '%s lua %s -' "$round" "$(awk '/^pairs/ {print $2}' "$WORK/out")" >>"$WORK/results"
  redis_after

  echo "## round $round: sluice's fixed-window script alone, as fast as the bare pairs (incrload -sluice), load average $(cut -d' ' -f1 /proc/loadavg)"
  redis_before flush
  "$WORK/incrload" -url "$RURL" -c 64 -d "$DUR" -keys 100000 -sluice | tee "$WORK/out"
  printf '%s script %s -' "$round" "$(awk '/^pairs/ {print $2}' "$WORK/out")" >>"$WORK/results"
  redis_after
done

echo "## summary (ratios against the same round's floors; lower is better)"
python3 - "$WORK/results" "$WORK/extra" <<'PY'
import re, sys
def secs(s):
    if s in ('-', ''): return None
    m = re.fullmatch(r'([0-9.]+)(h|m|s|ms|µs|us|ns)', s)
    if not m:  # Go's 1m2.5s form
        t = 0.0
        for v, u in re.findall(r'([0-9.]+)(h|ms|µs|us|ns|m|s)', s):
            t += float(v) * {'h': 3600, 'm': 60, 's': 1, 'ms': 1e-3, 'µs': 1e-6, 'us': 1e-6, 'ns': 1e-9}[u]
        return t
    return float(m.group(1)) * {'h': 3600, 'm': 60, 's': 1, 'ms': 1e-3, 'µs': 1e-6, 'us': 1e-6, 'ns': 1e-9}[m.group(2)]
rows = {}  # round -> name -> figures summed over the slices
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 7: continue
    rnd, name, n, cpu, rcpu, usec, calls = f[:7]
    x = rows.setdefault(rnd, {}).setdefault(name, dict(n=0, cpu=0.0, rcpu=None, usec=None, calls=None, reads=None))
    x['n'] += int(n)
    x['cpu'] += secs(cpu) or 0.0
    for k, v in (('rcpu', rcpu), ('usec', usec), ('calls', calls), ('reads', f[7] if len(f) > 7 else '-')):
        if v != '-':
            x[k] = (x[k] or 0) + float(v)
extra = {}  # (round, name) -> (client CPU s summed, load averages)
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) == 4:
        c, loads = extra.get((f[0], f[1]), (0.0, []))
        extra[(f[0], f[1])] = (c + (secs(f[2]) or 0.0), loads + [float(f[3])])
def per(x, k):  # a phase's figure k per request (µs for CPU)
    return x[k] / x['n'] * (1e6 if k in ('cpu', 'rcpu') else 1)
ratios = {}
def keep(name, v):
    ratios.setdefault(name, []).append(v)
for rnd, r in sorted(rows.items(), key=lambda kv: int(kv[0])):
    print(f"round {rnd}: load average at the slices' starts: " + ", ".join(f"{k} {min(extra[(rnd, k)][1]):.1f}–{max(extra[(rnd, k)][1]):.1f}" for k in r if (rnd, k) in extra))
    fl = per(r['floor'], 'cpu')
    print(f"round {rnd}: service CPU per request (µs): empty handler {fl:.1f}", end='')
    for name in ('memory', 'redis', 'erl', 'scripts'):
        if name not in r: continue
        v = per(r[name], 'cpu')
        keep(f"service CPU ÷ empty handler: {name}", v / fl)
        print(f"; {name} {v:.1f} ({v/fl:.2f}×)", end='')
    print()
    if 'floorgc' in r:
        fg = per(r['floorgc'], 'cpu')
        print(f"round {rnd}: service CPU per request (µs): empty handler at GOGC=400 {fg:.1f}", end='')
        for name in ('memory', 'redis', 'scripts'):
            if name not in r: continue
            v = per(r[name], 'cpu')
            keep(f"service CPU ÷ empty handler at GOGC=400: {name}", v / fg)
            print(f"; {name} {v/fg:.2f}×", end='')
        print()
    s = r['redis']
    if 'erl' in r:
        e = r['erl']
        keep("req/s ÷ ERL's: sluice redis (default)", s['n'] / e['n'])
        keep("Redis CPU per request ÷ ERL's: sluice redis (default)", per(s, 'rcpu') / per(e, 'rcpu'))
        line = (f"round {rnd}: vs envoyproxy/ratelimit: req/s sluice {s['n']} / ERL {e['n']} = {s['n']/e['n']:.2f}× (target ≥ 2×); "
                f"Redis CPU per request (µs, /proc) sluice {per(s, 'rcpu'):.2f} / ERL {per(e, 'rcpu'):.2f} = {per(s, 'rcpu')/per(e, 'rcpu'):.2f}× (target ≤ 0.5×); "
                f"Redis calls per request sluice {s['calls']/s['n']:.2f}, ERL {e['calls']/e['n']:.2f}")
        if 'scripts' in r:
            x = r['scripts']
            keep("req/s ÷ ERL's: sluice scripts (plain_windows: false)", x['n'] / e['n'])
            keep("Redis CPU per request ÷ ERL's: sluice scripts", per(x, 'rcpu') / per(e, 'rcpu'))
            line += f"; scripts: req/s {x['n']/e['n']:.2f}×, Redis CPU {per(x, 'rcpu')/per(e, 'rcpu'):.2f}×"
        print(line)
        tot = {}
        for name in ('floor', 'redis', 'erl'):
            c = extra.get((rnd, name), (0.0,))[0]
            if not c or name not in r: continue
            tot[name] = (c / r[name]['n'] * 1e6, per(r[name], 'cpu'), per(r[name], 'rcpu') if r[name]['rcpu'] is not None else 0.0)
        if 'redis' in tot and 'erl' in tot:
            fmt = lambda t: f"{t[0]:.1f} + {t[1]:.1f} + {t[2]:.1f} = {sum(t):.1f}"
            keep("CPU per request, load generator + service + Redis: ERL's ÷ sluice's", sum(tot['erl']) / sum(tot['redis']))
            keep("CPU per request, service + Redis: ERL's ÷ sluice's", (tot['erl'][1] + tot['erl'][2]) / (tot['redis'][1] + tot['redis'][2]))
            print(f"round {rnd}: CPU per request (µs), load generator + service + Redis: sluice {fmt(tot['redis'])}, ERL {fmt(tot['erl'])}"
                  f" -> ERL's ÷ sluice's {sum(tot['erl'])/sum(tot['redis']):.2f}× (without the load generator {(tot['erl'][1]+tot['erl'][2])/(tot['redis'][1]+tot['redis'][2]):.2f}×)")
    if 'floorrate' in r:
        fr = per(r['floorrate'], 'cpu')
        print(f"round {rnd}: service CPU per request (µs): empty handler at sluice's Redis rate {fr:.1f} -> redis {per(s, 'cpu')/fr:.2f}× it")
    if 'bare' not in r: continue
    b = r['bare']
    sp, bp = per(s, 'rcpu'), per(b, 'rcpu')
    su, bu = s['usec'] / s['n'], b['usec'] / b['n']
    print(f"round {rnd}: Redis CPU per decision (µs), /proc: sluice {sp:.2f}, bare INCRBY+PEXPIRE {bp:.2f} -> {sp/bp:.2f}×" +
          (f"; scripts {per(r['scripts'], 'rcpu'):.2f} -> {per(r['scripts'], 'rcpu')/bp:.2f}×" if 'scripts' in r else ''))
    rd = lambda x: f"{x['reads']/x['n']:.3f}" if x.get('reads') is not None else '?'
    print(f"round {rnd}: Redis reads per decision: sluice {rd(s)}" + (f", ERL {rd(r['erl'])}" if 'erl' in r else '') +
          (f", scripts {rd(r['scripts'])}" if 'scripts' in r else '') + f", bare pair {rd(b)}")
    print(f"round {rnd}: Redis CPU per decision (µs), commandstats: sluice {su:.2f} ({s['calls']/s['n']:.2f} calls per decision), bare {bu:.2f} ({b['calls']/b['n']:.2f} calls per pair) -> {su/bu:.2f}×")
    if 'barerate' in r:
        qp = per(r['barerate'], 'rcpu')
        print(f"round {rnd}: Redis CPU per decision (µs), /proc: bare INCRBY+PEXPIRE at sluice's rate {qp:.2f} -> sluice {sp/qp:.2f}× it")
    if 'lua' in r:
        lp = per(r['lua'], 'rcpu')
        print(f"round {rnd}: Redis CPU per decision (µs), /proc: the pair in a minimal Lua script {lp:.2f} -> {lp/bp:.2f}× bare (the floor of any script-based decision)")
    if 'script' in r:
        xp = per(r['script'], 'rcpu')
        print(f"round {rnd}: Redis CPU per decision (µs), /proc: sluice's fixed-window script at the bare pairs' pace {xp:.2f} -> {xp/bp:.2f}× bare")
    print(f"round {rnd}: completed: " + ", ".join(f"{k} {v['n']}" for k, v in r.items()) + " (requests; pairs for incrload)")
print("## ratios over the rounds: median [min–max]")
for name, vs in ratios.items():
    vs = sorted(vs)
    print(f"{name}: {vs[len(vs)//2] if len(vs) % 2 else (vs[len(vs)//2-1]+vs[len(vs)//2])/2:.2f} [{vs[0]:.2f}–{vs[-1]:.2f}]")
PY
