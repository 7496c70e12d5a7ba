// Package redisstore is sluice's Redis store: any number of stateless
// sluice instances share their limits in Redis and give the same answers.
//
// Every operation is one Lua script, run with EVALSHA (falling back to EVAL
// after a NOSCRIPT reply, as after a restart) in one round trip. The
// scripts live in lua/*.lua and mirror package algo exactly: the script
// reads the time from Redis TIME, applies the algorithm, writes the key
// with a TTL that ends when its state no longer matters, and replies with
// a few integers from which the client computes the Decision with algo's
// 128-bit arithmetic. ApplyAll checks and charges several keys all or
// nothing in the same single call; on Cluster they must share a hash tag.
//
// Lua numbers are doubles. Unix times in nanoseconds do not fit their 53
// bits, so a script works on offsets from now, exact up to 2^53 ns (104
// days): limits whose burst refills within that (all but the most extreme)
// are exact to the nanosecond. Beyond it values are rounded to within a
// part in 2^53.
//
// Around the scripts: a deadline per call (50ms by default), a circuit
// breaker so that a down Redis costs no timeout per call, a failure Policy
// (fail_open, fail_closed, local, error) with Decision.Degraded set, and a
// local over-limit cache that answers a denied key until its RetryAfter
// passes. See docs/redis.md.
package redisstore
