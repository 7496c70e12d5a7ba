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
// With Options.PlainWindows, fixed windows are counted in one key per
// window, and a one-key OpAllow well inside its window is a pipelined
// INCRBY + PEXPIRE instead of a script, on a per-node estimate of Redis
// TIME (plain.go, redisclock.go); the scripts decide the rest.
//
// Lua numbers are doubles. Unix times in nanoseconds do not fit their 53
// bits, so a script works on offsets from now, exact up to 2^53 ns (104
// days): limits whose burst refills within that (all but the most extreme)
// are exact to the nanosecond. Beyond it values are rounded to within a
// part in 2^53.
//
// Around the scripts: a deadline per call (50ms by default), errors that
// wrap ErrUnavailable when Redis cannot answer, a connection made in the
// background when Redis is down at New, and a local over-limit cache that
// answers a denied key until its RetryAfter passes. The store implements
// guard.Sharded (the Cluster master of each key), guard.Membership
// (instances counted by heartbeat) and guard.Pinger: wrap it in package
// guard for the failure policy, the circuit per master and the bounds in
// docs/redis.md.
package redisstore
