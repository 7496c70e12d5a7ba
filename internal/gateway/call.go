package gateway

// A request's state as it passes the stages, from ingress to settlement.

import (
	"context"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/upstream"
)

// call is one request's state through the proxy. Its fields are written
// and read by the request's goroutine only.
type call struct {
	id          string
	start       time.Time
	client      *client
	ep          endpoint
	model       string // metric label
	rawModel    string // as the client named it
	maxTokens   int64  // the completion budget the client named, 0 if none (traced)
	respModel   string // the model the upstream named in its answer (traced)
	traced      bool   // the request's span records: the relay reads respModel
	stream      bool
	wantUsage   bool // the client asked for the usage event itself
	bud         callBudget
	body        []byte
	captured    []byte // the JSON response body, read whole (captureReader)
	promptEst   int64
	rateIn      int64             // the prompt as OpenAI's and Azure's rate limiters estimate it (pool.go)
	countWeigh  func(int64) int64 // not nil: the upstream counts the prompt once admitted, weighted so (countAdmitted)
	reserved    int64
	defaultCap  int64 // completion tokens per choice reserved when the client set none (forwardCap)
	specs       []*spec
	reqs        []sluice.Request
	windowEnds  []time.Time // per reqs: when a fixed window's charge's window ends (admit.go's noteWindows); nil when none is a window
	sent        time.Time   // upstream round trip started
	headersAt   time.Time
	status      int
	unreachable bool           // no upstream response
	up          *upstreamTrace // notes whether the upstream got the whole request; nil before it is sent
	timedOut    bool           // unreachable: no response headers within upstream.timeout
	rejected    bool           // upstream answered 429 or 5xx
	canceled    bool           // the client went away before the response
	usageSeen   bool
	prompt      int64
	completion  int64
	produced    int64        // completion tokens relayed in a stream
	unread      bool         // a streamed event too long to read was relayed (relay.go): it may have held the usage
	background  bool         // a responses request run in the background: it runs on when the client leaves
	renewal     leaseRenewal // renews the leases while in flight (renew.go); stopped by settle once the handler returned
	anth        anthropicUsage
	settled     atomic.Bool
	reserving   chan struct{}  // closed once a leased tier's reservation is taken (applyLeased)
	pooledResv  bool           // the reservation was taken ahead (resvPool): no other settler knows its id
	pooledAt    time.Time      // when that reservation was asked for (pooledResv.at)
	capacity    *capacityGrant // the model's shared capacity charged (queue.go)
	path        string         // the request's path, as received
	route       *upstream.Route
	grant       *upstream.Grant // the upstream reservation of the attempt sent last (pool.go)
	cacheKey    string          // the body's prompt_cache_key, a pool's affinity (pool.go)
	unsent      bool            // refused before any upstream had it: refunded whole
	noRoom      time.Duration   // the last upstream unreachable and no other with room before routing.deadline: when one has (pool.go)
	fair        fairUsage       // what the queue counted for fairness (queue.go)
	limitedBy   string          // the limit the gateway answered 429 by, "" if none (console.go)
	retry       time.Duration   // its Retry-After
	storeCtx    storeCtx        // the admission's store deadline (applyAdmit)
	resvFailed  atomic.Bool     // the reservation taken in the background failed (applyLeased): not recycled
	degraded    bool            // a failure policy made one of its admission's decisions: not recycled

	// Room for specs, reqs and the admission's decisions of a request
	// with up to callLimits limits, in the call itself (callpool.go).
	specsBuf [callLimits]*spec
	reqsBuf  [callLimits]sluice.Request
	dsBuf    [callLimits]sluice.Decision
}

// upstreamTrace notes, through the request's client trace, whether the
// upstream got the whole request (settle: a request it never had is
// refunded whole). It is not part of the call: the transport may call it
// after the handler has returned (a response that came before the body
// was all written), when the call may be another request's (callpool.go).
type upstreamTrace struct {
	trace httptrace.ClientTrace
	wrote atomic.Bool
}

// wroteRequest is the trace's WroteRequest: the whole request reached the
// upstream's connection.
func (t *upstreamTrace) wroteRequest(info httptrace.WroteRequestInfo) {
	if info.Err == nil {
		t.wrote.Store(true)
	}
}

// wroteUpstream reports whether an upstream got c's whole request, on
// any attempt.
func (c *call) wroteUpstream() bool { return c.up != nil && c.up.wrote.Load() }

type callKey struct{}

func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}
