package gateway

// Calls recycled
//
// A request's call (about 3 KiB with the room for its limits' requests
// and decisions) is taken from the Gateway's pool and given back once it
// is settled, when nothing else can still reach it. What can reach a call,
// and when it is done with it:
//
//   - the request's goroutine, until ServeHTTP returns; its last act is
//     settleAsync, which hands the call to the settling goroutine;
//   - the settling goroutine (settle), which gives the call back;
//   - the reservation taken in the background (applyLeased), closed
//     c.reserving when done, which settle waits for;
//   - the lease renewal's timer (renew.go), which settle stops first,
//     waiting for a renewal in progress; a call whose timer fired for its
//     request is not given back (a renewal that fires late finds the
//     renewal stopped, but reads the call to find it); one whose timer
//     was stopped before it fired keeps the timer for its next request;
//   - the request's context (callKey, the admission's storeCtx), which the
//     transport and the stores may keep after they return: the trace the
//     transport calls late is not part of the call (upstreamTrace); a
//     store call that failed may still run with the context in a store's
//     worker (the guard's bounded calls), so a call whose admission,
//     reservation or settlement saw a store error, or whose admission a
//     failure policy answered (a Degraded decision, the call running on
//     behind it), is not given back;
//   - an upstream pool's grants and attempts, the queue's items (which
//     hold c.reqs), a traced request's span, a background response, an
//     Anthropic count: calls with any of them are not given back either:
//     they are not the hot path this serves.
//
// A call that is not given back is left to the garbage collector, as every
// call was before. TestCallRecycling runs requests of every such kind
// under the race detector with each recycled call overwritten as it goes
// back.

// callLimits is how many limits of a request fit in its call's own room
// (specsBuf, reqsBuf, dsBuf); a request with more allocates its slices.
const callLimits = 8

// newCall returns a zeroed call (but for its renewal's stopped timer,
// renew.go), recycled when one is free.
func (g *Gateway) newCall() *call {
	if c, ok := g.calls.Get().(*call); ok {
		return c
	}
	return &call{}
}

// recycle gives c back for another request once its settlement is done
// (settleAsync), unless something may still reach it (see above). clean
// reports that no store call of its settlement failed.
func (g *Gateway) recycle(c *call, clean bool) {
	if !clean || c.degraded || c.resvFailed.Load() || c.renewal.fired || g.pool != nil || g.queue != nil || c.traced || c.background || c.countWeigh != nil {
		return
	}
	timer := c.renewal.timer // stopped before it fired for c's request (renew.go)
	*c = call{}
	c.renewal.timer = timer
	if g.onRecycle != nil && !g.onRecycle(c) {
		return
	}
	g.calls.Put(c)
}
