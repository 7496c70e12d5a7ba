#!/usr/bin/env bash
# bench/compare.sh BASE: the hot paths' Go benchmarks at HEAD (the work
# tree as it is) and at BASE, built side by side and run interleaved in one
# sitting, old then new, COUNT rounds, and compared by benchstat. A loaded
# or shared machine slows both sides alike within a round, so the ratios
# hold where absolute figures do not. `make bench-compare BASE=<commit>`.
#
# Environment:
#   COUNT      rounds (6); benchstat wants at least 6 for a confidence interval
#   BENCHTIME  -test.benchtime of each run (100ms)
#   PKGS       packages, each "dir:regexp" (the list below)
#   BENCHSTAT  the benchstat command (go run of a pinned golang.org/x/perf)
#
# A benchmark that exists on one side only is printed without a ratio. The
# raw outputs stay in the temporary directory it prints.
set -euo pipefail
BASE=${1:?usage: bench/compare.sh BASE [COUNT]}
COUNT=${2:-${COUNT:-6}}
BENCHTIME=${BENCHTIME:-100ms}
BENCHSTAT=${BENCHSTAT:-go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da}
# core, Redis store (on a redis-server of its own), lease, Envoy RLS,
# RLQS and gateway paths; bench/redis is the bench module's redis_rate
# comparison. The gateway's is its CPU per request (cpu-µs/op) on the memory
# store (BenchmarkServeHTTP) and on leased Redis (BenchmarkServeHTTPLeased,
# whose B/op at 100ms includes the lease fetches' new Redis connections);
# its tail against a bare proxy is BenchmarkTailRatio, too long
# for a round here (make bench runs it).
PKGS=${PKGS:-"algo:GCRAAllow|Apply$ memstore:AllowSingleKey|Allow100k|BytesPerKey|Algorithms|AllowAll3 redisstore:GroupCommit|PlainAllow internal/envoyrls:Service lease:LeasedHotKey internal/rlqs:Report$|StoreAllow internal/gateway:ServeHTTP$|ServeHTTPLeased$ bench/core:. bench/redis:GCRA64|Redis64|LeaseHot"}

root=$(git rev-parse --show-toplevel)
base=$(git -C "$root" rev-parse --verify "$BASE^{commit}")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-compare.XXXXXX")
cleanup() { git -C "$root" worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; }
trap cleanup EXIT
git -C "$root" worktree add --detach --quiet "$tmp/base" "$base"
echo "bench-compare: old $base, new HEAD $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo '+dirty'), $COUNT rounds of $BENCHTIME; raw output in $tmp" >&2
grep -m1 'model name' /proc/cpuinfo >&2 || true

# build compiles each package's test binary in tree $1 into $tmp/$2.
build() {
	local tree=$1 side=$2 spec dir bin
	mkdir -p "$tmp/$side"
	for spec in $PKGS; do
		dir=${spec%%:*}
		bin=$tmp/$side/$(echo "$dir" | tr / _).test
		if [ ! -d "$tree/$dir" ]; then continue; fi
		case $dir in
		bench/*) (cd "$tree/bench" && go test -c -o "$bin" "./${dir#bench/}") ;;
		*) (cd "$tree" && go test -c -o "$bin" "./$dir") ;;
		esac
	done
}
build "$tmp/base" old
build "$root" new

for round in $(seq "$COUNT"); do
	for side in old new; do
		tree=$root
		[ "$side" = old ] && tree=$tmp/base
		for spec in $PKGS; do
			dir=${spec%%:*}
			re=${spec#*:}
			bin=$tmp/$side/$(echo "$dir" | tr / _).test
			[ -x "$bin" ] || continue
			# Each binary runs in its package's directory (testdata).
			(cd "$tree/$dir" && SLUICE_BENCH_REDIS=1 "$bin" -test.run '^$' -test.bench "$re" \
				-test.benchtime "$BENCHTIME" -test.benchmem -test.count 1) >>"$tmp/$side.txt" 2>>"$tmp/$side.err" ||
				echo "bench-compare: $side $dir failed in round $round (see $tmp/$side.err)" >&2
		done
	done
	echo "bench-compare: round $round of $COUNT done" >&2
done
trap - EXIT
cleanup
cd "$tmp" && $BENCHSTAT old.txt new.txt
