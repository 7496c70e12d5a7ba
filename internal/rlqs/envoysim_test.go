package rlqs_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

// simEnvoy behaves as Envoy's rate_limit_quota filter does for one bucket,
// as its global client (source/extensions/filters/http/rate_limit_quota/
// global_client_impl.cc) and the RLQS proto describe it:
//
//   - one stream to the quota service; every report names the domain;
//   - a report of the bucket's requests allowed and denied when the
//     bucket is created, then one every reporting interval on a timer;
//     time_elapsed carries whole seconds only (getUsageFromBucket);
//   - the pushed assignment is enforced locally: a token bucket of
//     max_tokens, created full, filled continuously at tokens_per_fill per
//     fill_interval's whole seconds (createTokenBucketFromAction); an
//     assignment equal to the last (max_tokens, tokens_per_fill and
//     fill_interval's nanos) keeps the bucket and its tokens
//     (shouldReplaceTokenBucket), any other starts a fresh, full one; a
//     blanket rule; abandon forgets it;
//   - an assignment expires after assignment_time_to_live's whole seconds
//     (startActionExpirationTimer); without one the no_assignment_behavior
//     applies, here DENY_ALL (the fail-closed setting docs/envoy.md
//     recommends where the bound matters);
//   - a broken stream is reopened at the next report timer, to the next
//     address of the cluster (onSendReportsTimer); assignments are kept
//     until they expire meanwhile.
//
// At its worst, several Envoys started together report at the same
// instant: their timers were armed at the same time.
type simEnvoy struct {
	addrs    []string
	domain   string
	id       map[string]string
	interval time.Duration
	record   func(time.Time) // each admitted request
	starved  func(time.Time) // a tick that came more than 25 ms late

	mu        sync.Mutex
	next      int // address to dial next
	stream    rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	conn      *grpc.ClientConn
	first     bool
	strategy  *typev3.RateLimitStrategy // nil: no assignment
	expires   time.Time
	tokens    float64
	max       float64
	rate      float64 // tokens per second
	filled    time.Time
	allowed   uint64
	denied    uint64
	decided   uint64 // requests decided, over the whole run
	reported  time.Time
	assigned  []assignment // token assignments received, in order
	denies    []time.Time  // DENY_ALL assignments received, in order
	reconnect int
}

type assignment struct {
	at time.Time
	g  int64 // tokens per fill
}

// admit decides one request at now, as the filter does.
func (e *simEnvoy) admit(now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	ok := e.decide(now)
	e.decided++
	if ok {
		e.allowed++
		e.record(now)
	} else {
		e.denied++
	}
	return ok
}

func (e *simEnvoy) decide(now time.Time) bool {
	if e.strategy == nil || !now.Before(e.expires) {
		return false // no_assignment_behavior / expired: DENY_ALL
	}
	switch s := e.strategy.Strategy.(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return s.BlanketRule == typev3.RateLimitStrategy_ALLOW_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		if now.After(e.filled) {
			e.tokens = math.Min(e.max, e.tokens+e.rate*now.Sub(e.filled).Seconds())
			e.filled = now
		}
		if e.tokens >= 1 {
			e.tokens--
			return true
		}
	}
	return false
}

// apply takes one response's action for the bucket.
func (e *simEnvoy) apply(now time.Time, r *rlqsv3.RateLimitQuotaResponse) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, a := range r.GetBucketAction() {
		if ab := a.GetAbandonAction(); ab != nil {
			e.strategy = nil
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		if qa == nil {
			continue
		}
		st := qa.GetRateLimitStrategy()
		e.expires = now.Add(time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
		if st.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL {
			e.denies = append(e.denies, now)
		}
		if tb := st.GetTokenBucket(); tb != nil {
			max := float64(tb.GetMaxTokens())
			rate := float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
			old := e.strategy.GetTokenBucket()
			if old == nil || old.GetMaxTokens() != tb.GetMaxTokens() || old.GetTokensPerFill().GetValue() != tb.GetTokensPerFill().GetValue() || old.GetFillInterval().GetNanos() != tb.GetFillInterval().GetNanos() {
				e.tokens, e.filled = max, now // a fresh, full bucket
			}
			e.max, e.rate = max, rate
			e.assigned = append(e.assigned, assignment{now, int64(tb.GetTokensPerFill().GetValue())})
		}
		e.strategy = st
	}
}

// report sends the usage since the last report, reopening the stream first
// if it is broken.
func (e *simEnvoy) report(ctx context.Context, now time.Time) {
	e.mu.Lock()
	if e.stream == nil {
		e.mu.Unlock()
		e.dial(ctx)
		e.mu.Lock()
		if e.stream == nil {
			e.mu.Unlock()
			return
		}
	}
	msg := &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId:           &rlqsv3.BucketId{Bucket: e.id},
		TimeElapsed:        durationpb.New(now.Sub(e.reported).Truncate(time.Second)),
		NumRequestsAllowed: e.allowed,
		NumRequestsDenied:  e.denied,
	}}}
	msg.Domain = e.domain
	e.allowed, e.denied, e.reported = 0, 0, now
	st := e.stream
	e.mu.Unlock()
	if err := st.Send(msg); err != nil {
		e.breakStream(st)
	}
}

func (e *simEnvoy) dial(ctx context.Context) {
	e.mu.Lock()
	addr := e.addrs[e.next%len(e.addrs)]
	e.next++
	e.mu.Unlock()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		_ = conn.Close()
		return
	}
	e.mu.Lock()
	e.stream, e.conn, e.first = st, conn, true
	e.reconnect++
	e.mu.Unlock()
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				e.breakStream(st)
				return
			}
			e.apply(time.Now(), r)
		}
	}()
}

// breakStream forgets st if it is the current stream.
func (e *simEnvoy) breakStream(st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stream == st {
		e.stream = nil
		_ = e.conn.Close()
	}
}

// cut breaks the stream from the client's side, as an Envoy whose
// connection is reset.
func (e *simEnvoy) cut() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stream != nil {
		_ = e.conn.Close()
		e.stream = nil
	}
}

// run drives the envoy until ctx is done: demand() requests per second,
// spread evenly, and a report at start + phase, then every interval.
// Envoys given the same start and phase report at the same instant.
func (e *simEnvoy) run(ctx context.Context, start time.Time, phase time.Duration, demand func() float64) {
	first := start.Add(phase)
	select {
	case <-time.After(time.Until(first)):
	case <-ctx.Done():
		return
	}
	e.reported = first
	e.report(ctx, first)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	last, nextReport := time.Now(), first.Add(e.interval)
	carry := 0.0
	for {
		select {
		case <-ctx.Done():
			e.cut()
			return
		case now := <-tick.C:
			// The requests since the last tick arrive spread over it, as
			// they would at an Envoy, even when this tick came late on a
			// busy machine.
			from, span := last, now.Sub(last)
			if span > 30*time.Millisecond && e.starved != nil {
				e.starved(now)
			}
			carry += demand() * span.Seconds()
			last = now
			n := int(carry)
			for k := range n {
				e.admit(from.Add(span * time.Duration(k+1) / time.Duration(n)))
			}
			carry -= float64(n)
			if !now.Before(nextReport) {
				nextReport = nextReport.Add(e.interval)
				e.report(ctx, now)
			}
		}
	}
}

// recorder counts admissions in slots of 10 ms from start.
type recorder struct {
	start  time.Time
	slots  []atomic.Int64
	starve []atomic.Bool
}

func newRecorder(start time.Time, d time.Duration) *recorder {
	n := d/(10*time.Millisecond) + 1
	return &recorder{start: start, slots: make([]atomic.Int64, n), starve: make([]atomic.Bool, n)}
}

func (r *recorder) record(t time.Time) {
	i := int(t.Sub(r.start) / (10 * time.Millisecond))
	if i >= 0 && i < len(r.slots) {
		r.slots[i].Add(1)
	}
}

// markStarved notes that the simulation was starved of CPU at t.
func (r *recorder) markStarved(t time.Time) {
	i := int(t.Sub(r.start) / (10 * time.Millisecond))
	if i >= 0 && i < len(r.starve) {
		r.starve[i].Store(true)
	}
}

// starvedIn reports whether the simulation was starved in [from, to).
func (r *recorder) starvedIn(from, to time.Duration) bool {
	for i := max(0, int(from/(10*time.Millisecond))); i < int(to/(10*time.Millisecond)) && i < len(r.starve); i++ {
		if r.starve[i].Load() {
			return true
		}
	}
	return false
}

// between counts the admissions in [from, to) from start.
func (r *recorder) between(from, to time.Duration) int64 {
	var n int64
	for i := int(from / (10 * time.Millisecond)); i < int(to/(10*time.Millisecond)) && i < len(r.slots); i++ {
		n += r.slots[i].Load()
	}
	return n
}

var errNoAssignment = errors.New("no assignment")

// lastAssigned is the tokens per interval of the last assignment at or
// before t.
func (e *simEnvoy) lastAssigned(t time.Time) (int64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := len(e.assigned) - 1; i >= 0; i-- {
		if !e.assigned[i].at.After(t) {
			return e.assigned[i].g, nil
		}
	}
	return 0, errNoAssignment
}
