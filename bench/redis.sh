#!/usr/bin/env bash
# Measures sluice's Redis store against go-redis/redis_rate and Redis's own
# ceiling, each on its own redis-server, and prints the tables that
# docs/BENCHMARKS.md records. SLUICE_BENCH_DURATION sets each run (3s).
set -euo pipefail
cd "$(dirname "$0")"
SLUICE_BENCH_REDIS=1 go test -count=1 -run 'TestRedisReport|TestLeaseReport' -v -timeout 10m ./redis/ | grep -v -e '^=== RUN' -e '^--- ' -e '^PASS' -e '^ok'
