package gateway

// The settlement stage: a request's reservation settled exactly once
// against its usage, off the client's path, with retries while the store
// is unavailable.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/pricing"
)

// settle settles c's reservation; settleAsync makes sure it runs once.
// It reports whether every store call it made succeeded.
func (g *Gateway) settle(c *call) (clean bool) {
	c.renewal.stop() // before the leases are released: a renewal after would take them again
	c.readCapturedUsage()
	g.observeTimes(c)
	if c.reserving != nil {
		<-c.reserving
	}
	s := Settlement{RequestID: c.id, Client: c.client.id, Tier: c.client.tier.name, Model: c.model, Status: c.status, Reserved: c.reserved}
	refundRequests := false
	switch {
	case c.unsent:
		refundRequests = true // no upstream had room: refused before sending
	case c.usageSeen:
		s.PromptTokens, s.CompletionTokens, s.UsageReported = c.prompt, c.completion, true
		s.CacheCreationTokens, s.CacheReadTokens = c.anth.cacheCreation, c.anth.cacheRead
	case c.rejected:
		// The upstream answered 429 or 5xx: it generated nothing, but it
		// had the request, which counts. Refunding it let a client send
		// requests without bound while the upstream refused them, keeping
		// a shared upstream account throttled for every other key.
	case c.unreachable && !c.wroteUpstream():
		refundRequests = true // the upstream never had the request
	case c.background && (c.status == 0 || c.status/100 == 2):
		// A background response runs on after its request returned or its
		// client left, and its usage is read with GET, which does not
		// pass here: keep the reservation (its cap was forwarded).
		s.PromptTokens, s.CompletionTokens = c.promptEst, c.reserved-c.promptEst
	case c.unreachable && c.timedOut:
		// No headers within upstream.timeout: the upstream may still be
		// generating, and bill it. Keep the reservation, the best bound
		// known (a request made to outlast the timeout is not free).
		s.PromptTokens, s.CompletionTokens = c.promptEst, c.reserved-c.promptEst
	case c.unreachable:
		s.PromptTokens = c.promptEst // the upstream had the prompt, and failed
	case c.canceled && c.status == 0:
		s.PromptTokens = c.promptEst // the upstream may have read the prompt
	case c.status/100 != 2:
		// An upstream 4xx: nothing was generated.
	case c.stream:
		s.PromptTokens, s.CompletionTokens = c.promptEst, c.produced
		if c.unread {
			// The usage may have been in the event too long to read:
			// keep at least the reservation, the best bound known.
			s.CompletionTokens = max(s.CompletionTokens, c.reserved-c.promptEst)
		}
	default:
		// A 2xx without usage: keep the reservation, the best bound known.
		s.PromptTokens, s.CompletionTokens = c.promptEst, c.reserved-c.promptEst
	}
	s.Actual = addSat(s.PromptTokens, s.CompletionTokens)
	if c.grant != nil {
		gctx, gcancel := context.WithTimeout(context.Background(), g.cfg.Store.Timeout)
		if _, err := c.grant.Settle(gctx, s.PromptTokens, s.CompletionTokens, refundRequests); err != nil {
			s.Err = fmt.Errorf("gateway: settle %s: %w", c.id, err)
		}
		if s.UsageReported && c.ep.anthropic() {
			// What Anthropic's input limits count: input and cache writes.
			c.grant.Counted(gctx, addSat(c.anth.input, c.anth.cacheCreation))
		}
		gcancel()
	}
	s.Usage = settledUsage(c, &s)
	g.settleCost(c, &s)
	// The refunds are written over c.reqs, which nothing reads after
	// settle: refund j comes from member i >= j, already copied into req
	// when it is written (a slice per request less).
	refunds := c.reqs[:0]
	var charges []sluice.Request
	now := time.Now()
	for i, req := range c.reqs {
		if req.Algorithm == sluice.FixedWindow {
			// A window's refund names its charge's window (admit.go).
			// Set on refunds only: a charge takes no ReservedAhead.
			req.ReservedAhead = c.windowAhead(i, now)
		}
		switch c.specs[i].kind {
		case kindConcurrency, kindReservation:
			refunds = append(refunds, req)
		case kindTokens, kindBudget:
			var actual int64
			if c.specs[i].kind == kindBudget {
				actual = budgetCharge(s.Cost)
			} else {
				actual = g.tokenActual(c, c.specs[i], &s)
			}
			if d := req.Cost - actual; d > 0 {
				req.Cost = d
				refunds = append(refunds, req)
			} else if d < 0 {
				req.Cost, req.ReservedAhead = -d, 0
				charges = append(charges, req)
			}
		case kindRequests:
			if refundRequests {
				refunds = append(refunds, req)
			}
		}
	}
	// The refunds carry the request's lease, and the store applies a refund
	// batch only while its lease is held: of all the gateway instances,
	// only the first settlement of this request id refunds, and only then
	// are excess tokens charged. A lease that lapsed (a settlement later
	// than Options' LeaseTTL) leaves the reservation charged as it was.
	// That same rule makes a refund safe to retry while the store is
	// unreachable (refundHeld): an attempt that was applied after all
	// leaves the lease released, and the next attempt changes nothing.
	held := true
	if c.pooledResv && g.leases != nil {
		// Only this settlement knows the reservation's id: what the
		// leases take back needs no store call (settleIntoLeases).
		refunds = g.settleIntoLeases(c, refunds)
	}
	if len(refunds) > 0 {
		ds, retried, err := g.refundHeld(refunds)
		if err != nil {
			// Whether the lease is still held is unknown: charging now
			// could charge twice after a peer's settlement.
			held = false
			s.Err = fmt.Errorf("gateway: settle %s: refund: %w", c.id, err)
		}
		for i, d := range ds {
			if refunds[i].Algorithm == sluice.Concurrency && !d.Allowed && !retried {
				held = false
				s.Err = fmt.Errorf("gateway: settle %s: %w", c.id, ErrAlreadySettled)
			}
		}
		// After a retry a released lease is this settlement's own earlier
		// attempt, which the store ran after all (a stalled Redis runs
		// what it had received when it resumes): the refund is done.
	}
	if len(charges) > 0 && held && c.pooledResv && g.leases != nil {
		charges = g.leases.SettleLocal(sluice.OpCharge, charges) // drawn from the leases first
	}
	if len(charges) > 0 && held {
		if err := g.chargeUnsent(charges); err != nil {
			s.Err = errors.Join(s.Err, fmt.Errorf("gateway: settle %s: charge: %w", c.id, err))
		}
	}
	if g.queue != nil {
		// A deadline (a timer) only when there is a queue to settle.
		qctx, cancel := context.WithTimeout(context.Background(), g.cfg.Store.Timeout)
		if err := g.queue.settle(qctx, g.store, c, s.Actual, refundRequests, held); err != nil { // and wakes the queue
			s.Err = errors.Join(s.Err, err)
		}
		cancel()
	}
	ctx := context.Background()
	m := g.metrics
	tm := m.forTierModel(s.Tier, s.Model)
	if !c.unreachable && c.status == http.StatusOK {
		tm.ok.Inc() // statusLabel's "200"
	} else {
		m.requests.WithLabelValues(s.Tier, s.Model, statusLabel(c)).Inc()
	}
	tm.prompt.Add(float64(s.PromptTokens))
	tm.completion.Add(float64(s.CompletionTokens))
	g.countSpend(c, &s)
	level := slog.LevelDebug
	if s.Err != nil {
		level = slog.LevelError
	}
	if g.log.Enabled(ctx, level) { // else the arguments' boxing is a score of allocations per request for nothing
		g.log.Log(ctx, level, "gateway: request settled", "request_id", s.RequestID, "client", s.Client, "tier", s.Tier,
			"model", s.Model, "status", s.Status, "reserved", s.Reserved, "actual", s.Actual, "usage_reported", s.UsageReported, "err", s.Err)
	}
	c.client.status.touch()
	if g.onSettled != nil {
		g.onSettled(s)
	}
	return s.Err == nil
}

// Settlement retries: the first retry after settleRetryMin, doubling up to
// settleRetryMax, until the request's lease would have lapsed (LeaseTTL) or
// the Gateway closes.
const (
	settleRetryMin = 100 * time.Millisecond
	settleRetryMax = 2 * time.Second
)

// refundHeld applies a settlement's refund batch, retrying while the store
// is unavailable (sluice.ErrUnavailable, or no answer in Store.Timeout),
// so that a Redis that paused or
// failed over while requests finished gives back their concurrency slots
// and unused tokens when it returns, not a LeaseTTL later. Retrying is
// safe because the batch is applied only while the request's lease is
// held: once an attempt has applied, the lease is released and later ones
// are refused whole (their lease member comes back not Allowed). retried
// reports that an earlier attempt failed, so such a refusal may be its
// doing.
func (g *Gateway) refundHeld(refunds []sluice.Request) ([]sluice.Decision, bool, error) {
	return g.settleRetrying(sluice.OpRefund, refunds, func(err error) bool {
		// The attempt's own deadline passing is the store not answering
		// in time too (stores report a caller's deadline as it is).
		return errors.Is(err, sluice.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
	})
}

// chargeUnsent applies a settlement's excess charges (usage above the
// reservation), retrying as refundHeld does, but only while the store
// certainly did not receive the batch: the failure detector's circuit was
// open or the key's calls were all in flight (guard.ErrCircuitOpen,
// guard.ErrBusy). A charge is not idempotent, so a call that may have
// reached the store (a deadline: a stalled Redis runs it when it resumes)
// is not sent again. Without the retry, excess tokens or dollars used
// while the circuit was open were never charged: the key got them free.
func (g *Gateway) chargeUnsent(charges []sluice.Request) error {
	_, _, err := g.settleRetrying(sluice.OpCharge, charges, func(err error) bool {
		return errors.Is(err, guard.ErrCircuitOpen) || errors.Is(err, guard.ErrBusy)
	})
	return err
}

// settleRetrying applies op to reqs, each attempt bounded by Store.Timeout,
// and tries again with backoff (settleRetryMin doubling to settleRetryMax)
// while retry says the failure allows it, until LeaseTTL has passed or the
// gateway closes. retried reports that an earlier attempt failed.
func (g *Gateway) settleRetrying(op sluice.Op, reqs []sluice.Request, retry func(error) bool) (ds []sluice.Decision, retried bool, err error) {
	start := time.Now()
	giveUp := start.Add(g.cfg.LeaseTTL)
	wait := settleRetryMin
	var ahead []time.Duration // a window refund's ReservedAhead at start
	for {
		if retried {
			// A window's refund names its charge's window by the time
			// left until it ends: less by now.
			if ahead == nil {
				ahead = make([]time.Duration, len(reqs))
				for i := range reqs {
					ahead[i] = reqs[i].ReservedAhead
				}
			}
			since := time.Since(start)
			for i := range reqs {
				if reqs[i].Algorithm == sluice.FixedWindow && ahead[i] > 0 {
					reqs[i].ReservedAhead = max(ahead[i]-since, 1)
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Store.Timeout)
		ds, err = g.store.ApplyAll(ctx, op, reqs)
		cancel()
		if err == nil || !retry(err) || time.Now().Add(wait).After(giveUp) {
			return ds, retried, err
		}
		t := time.NewTimer(wait)
		select {
		case <-g.closing:
			t.Stop()
			return ds, retried, err
		case <-t.C:
		}
		retried = true
		g.metrics.settleRetries.Inc()
		wait = min(2*wait, settleRetryMax)
	}
}

func statusLabel(c *call) string {
	switch {
	case c.unreachable:
		return "502"
	case c.canceled && c.status == 0:
		return "canceled"
	}
	return strconv.Itoa(c.status)
}

// Settlement reports how one request's reservation was settled.
type Settlement struct {
	// RequestID is the gateway's id of the request, also sent to the client
	// as x-sluice-request-id and used as the concurrency lease.
	RequestID string
	// Client is the client id of the key (never the key).
	Client string
	// Tier and Model are the request's.
	Tier, Model string
	// Status is the status the upstream answered, 0 when unreachable.
	Status int
	// Reserved is the tokens reserved before forwarding; Actual what was
	// finally charged for them.
	Reserved, Actual int64
	// PromptTokens and CompletionTokens are the usage the charge is based
	// on: reported by the upstream when UsageReported, else estimated.
	// For an Anthropic request PromptTokens weighs cached input as
	// Anthropic bills it: input_tokens + ⌈1.25·CacheCreationTokens⌉ (2·
	// for the part written for an hour) + ⌈0.1·CacheReadTokens⌉. Usage is the same split into disjoint kinds
	// (cached input and reasoning reported by the upstream), which token
	// limits weigh by the model's token_weights.
	PromptTokens, CompletionTokens int64
	UsageReported                  bool
	Usage                          pricing.Usage
	// Team is the key's team, "" when it has none.
	Team string
	// CachedTokens and ReasoningTokens are the parts of PromptTokens and
	// CompletionTokens the upstream reported as cached and as reasoning.
	CachedTokens, ReasoningTokens int64
	// ReservedCost is the maximum cost reserved on the request's dollar
	// budgets, Cost what was finally charged to them; both zero when no
	// budget applies (budget.go).
	ReservedCost, Cost pricing.Micros
	// CacheCreationTokens and CacheReadTokens are an Anthropic upstream's
	// cache_creation_input_tokens and cache_read_input_tokens.
	CacheCreationTokens, CacheReadTokens int64
	// Err is the store's error, if settling failed.
	Err error
}

// ErrAlreadySettled means a request's reservation lease was no longer held
// when the gateway settled it: another settlement came first, or the lease
// lapsed. Nothing was refunded or charged.
var ErrAlreadySettled = errors.New("gateway: reservation already settled or lapsed")

// settleAsync settles c exactly once, in the background, so that the
// store round trips stay off the client's path (a keep-alive connection's
// next request waits for this handler to return). Close waits for it.
func (g *Gateway) settleAsync(c *call) {
	if !c.settled.CompareAndSwap(false, true) {
		return
	}
	g.pending.Add(1)
	go func() {
		defer g.pending.Done()
		g.recycle(c, g.settle(c)) // callpool.go
	}()
}
