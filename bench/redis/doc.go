// Package redis benchmarks sluice's Redis store against go-redis/redis_rate
// and against Redis's own ceiling (redis-benchmark), each on a redis-server
// of its own started by internal/redistest. Run bench/redis.sh, which runs
// TestRedisReport and prints the figures docs/BENCHMARKS.md records, or the
// Go benchmarks with go test -bench.
package redis
