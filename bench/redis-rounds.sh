#!/usr/bin/env bash
# bench/redis-rounds.sh [ROUNDS] [BENCHTIME]: the issue's Redis targets as
# interleaved rounds. The bench/redis test binary is built once and run
# ROUNDS times (5), each run doing BenchmarkRedis64 (redis_rate, then
# sluice's gcra, token_bucket, fixed_window) and BenchmarkLeaseHot for
# BENCHTIME each (1s), so that the baseline and sluice alternate within a
# round: a change of load on a shared machine falls on both. (go test's
# -count N runs each benchmark N times in a row instead, and a change of
# load between them reads as a change of ratio.) Prints, per sluice row,
# the decisions/s ratio to redis_rate of the same round, round by round
# and as median [min–max], the ratio of Redis CPU per decision (INFO cpu,
# I/O included), and the ratio of Redis's script time per decision (INFO
# commandstats usec of EVAL and EVALSHA ÷ decisions: per call × calls per
# decision; Redis64 rows only) with sluice's script calls per decision.
# Each benchmark starts its own redis-server. Leases start from the store
# and take their chunks in the first 100s of ms:
# keep BENCHTIME at 1s or more for the LeaseHot row (200ms gave 5.7×).
set -euo pipefail
ROUNDS=${1:-5}
BENCHTIME=${2:-1s}
cd "$(dirname "$0")"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/redis-rounds.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/redis.test" ./redis/
grep -m1 'model name' /proc/cpuinfo || true
for r in $(seq "$ROUNDS"); do
	(cd redis && SLUICE_BENCH_REDIS=1 "$tmp/redis.test" -test.run '^$' -test.bench 'Redis64|LeaseHot' \
		-test.benchtime "$BENCHTIME" -test.count 1) | grep '^Benchmark' | sed "s/^/$r /" >>"$tmp/out.txt"
	echo "round $r of $ROUNDS done" >&2
done
awk '
function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return a[int((n + 1) / 2)]
}
{
	name = $2; sub(/-[0-9]+$/, "", name)
	ns[$1, name] = $4
	for (i = 5; i < NF; i++) {
		if ($(i+1) == "redis-cpu-ns/op") cpu[$1, name] = $i
		if ($(i+1) == "script-ns/call") scr[$1, name] = $i
		if ($(i+1) == "calls/op") calls[$1, name] = $i
	}
	if (!(name in seen)) { seen[name] = 1; order[++nn] = name }
	rounds[$1] = 1
}
END {
	printf "| sluice | decisions/s × redis_rate, median [min–max] | per round | Redis CPU per decision ÷ redis_rate'"'"'s, median [min–max] | script time per decision ÷ redis_rate'"'"'s, median [min–max] | script calls per decision |\n|---|---|---|---|---|---|\n"
	for (k = 1; k <= nn; k++) {
		name = order[k]
		if (name !~ /sluice/) continue
		base = name; sub(/\/sluice.*/, "/redis_rate", base)
		n = 0; m = 0; per = ""
		for (r in rounds) {
			if (!((r, name) in ns) || !((r, base) in ns)) continue
			n++; x[n] = ns[r, base] / ns[r, name]; y[n] = cpu[r, name] / cpu[r, base]
			if (((r, name) in scr) && ((r, base) in scr) && scr[r, base] > 0) {
				m++; z[m] = scr[r, name] * calls[r, name] / (scr[r, base] * calls[r, base]); c[m] = calls[r, name]
			}
		}
		for (r = 1; r <= length(rounds); r++) if ((r, name) in ns && (r, base) in ns) per = per sprintf(" %.2f", ns[r, base] / ns[r, name])
		lo = 1e18; hi = 0; clo = 1e18; chi = 0
		for (i = 1; i <= n; i++) { if (x[i] < lo) lo = x[i]; if (x[i] > hi) hi = x[i]; if (y[i] < clo) clo = y[i]; if (y[i] > chi) chi = y[i] }
		st = "–"; sc = "–"
		if (m > 0) {
			zlo = 1e18; zhi = 0
			for (i = 1; i <= m; i++) { if (z[i] < zlo) zlo = z[i]; if (z[i] > zhi) zhi = z[i] }
			st = sprintf("%.2f [%.2f–%.2f]", median(z, m), zlo, zhi); sc = sprintf("%.3f", median(c, m))
		}
		printf "| %s | %.2f× [%.2f–%.2f] |%s | %.4f [%.4f–%.4f] | %s | %s |\n", name, median(x, n), lo, hi, per, median(y, n), clo, chi, st, sc
	}
}' "$tmp/out.txt"
