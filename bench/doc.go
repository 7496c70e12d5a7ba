// Package bench holds sluice's comparative benchmarks. It is a module of its
// own, so that the peers it measures against (x/time/rate, redis_rate, ...)
// stay out of the library's import graph. Run it with `make bench`.
package bench
