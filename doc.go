// Package sluice is a distributed rate limiter.
//
// A [Limiter] decides, per key, whether an event may happen now. It applies
// one [Algorithm] with one [Limit] and keeps its state in a [Store]: the
// embedded memory store (package memstore) for one process, or Redis (package
// redisstore) for a fleet of processes that must give the same answer. Every
// decision is one atomic step in the store, and the store supplies the time:
// the memory store from an injected clock, Redis from its TIME command, so
// servers with skewed clocks still agree.
//
// Most callers want [Limiter.Allow]. [AllowAll] checks several limits at once
// and charges them all or none, for example 10/s and 1000/day for one user.
package sluice
