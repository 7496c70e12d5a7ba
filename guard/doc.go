// Package guard keeps a rate limit when its store is slow or away. It
// wraps any sluice.Store (the Redis store, typically) and is one itself:
//
//	rs, _ := redisstore.New(ctx, redisstore.Options{URL: url, Timeout: guard.StoreTimeout(0, 0)})
//	store, _ := guard.New(rs, guard.Options{}) // Local policy, 50ms deadline
//	defer store.Close()
//
// Around every call it keeps:
//
//   - A deadline (Options.Timeout). A call that misses it, or fails, is
//     answered by the failure Policy: that one call, nothing else. A call
//     to a node that works (circuit closed, last probe answered) waits on
//     for its reply up to Options.LateGrace first: a live node's reply read
//     late on a busy machine is still the key's exact answer. While
//     its node works, a call that missed the deadline (in the store, or
//     waiting for its key's slot) is denied under every policy: it says
//     its key is flooded, and admitting it would let a client past its
//     limit by sending many requests at once.
//   - A failure detector per node (Sharded stores, such as Redis Cluster,
//     name the node of each key; others are one node). A node's circuit
//     opens only when the node fails across many keys within a window, or
//     stops answering the background probe, never because one call was
//     slow or one hot key queued. While open, its keys are answered by the
//     policy at once; keys on other nodes keep their exact answers.
//   - A bound on the calls one key has in flight (MaxInFlightPerKey):
//     one key's burst waits in its own callers, not in the store ahead of
//     every other key.
//   - A background probe, which opens circuits without traffic, closes
//     them when the node answers again, and makes Ready correct without
//     traffic; and, for a Membership store, a heartbeat per instance that
//     counts the live instances.
//   - The policies: Local (default) enforces limit ÷ instances in memory,
//     from the last state the store gave each key, and charges the store
//     with what it admitted before closing the circuit; FailOpen admits;
//     FailClosed denies; ReturnError returns an error wrapping
//     ErrUnavailable. Decisions they make have Degraded set and Fallback
//     naming the policy. Refund, charge and reset never get a policy
//     answer: while the store cannot apply them they return an error. One
//     wrapping ErrCircuitOpen or ErrBusy was not sent; any other may have
//     been applied (a deadline does not unsend a command), so a refund or
//     a charge sent again after it may count twice.
//
// The over-admission each policy allows, per state of the store, is
// written in docs/redis.md.
package guard
