package upstream

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
)

// The provider's units. Each provider counts a request's input its own
// way, and its limits hold what it counts, not what the gateway does:
//
//   - OpenAI and Azure OpenAI estimate it from its characters (about 4 a
//     token), a few tokens per message and its images by size and detail,
//     not with the tokenizer (package aitoken, RateLimitTokens, cites
//     their guides). A target of these kinds reserves the larger of that
//     estimate (Units.RateIn) and the gateway's count (Units.In).
//   - Anthropic counts the tokens of its own tokenizer, which its
//     count_tokens returns: Units.In, with routing.count_tokens the larger
//     of that count and the estimate.
//   - An openai-compatible server is reserved the gateway's count.
//
// What remains between that rule and the provider's count (a formula a
// little off, characters counted that the rule leaves out) is learned:
// per upstream model, the ratio of the input the provider counted to the
// input reserved before any ratio (the base), over the last period, kept
// in the shared store as two sliding-window sums (every replica adds its
// samples and reads the same ratio), so that the reservation converges to
// the provider's count within a period, whichever way they differ. The
// ratio multiplies the input only: the completion budget is counted as
// given by every provider. Samples of the provider's count of one request:
//
//   - OpenAI's and Azure's 429 that names it ("... Requested N"),
//   - Anthropic's usage, which is what its input limits count,
//   - OpenAI's and Azure's x-ratelimit-remaining-tokens delta between two
//     answers that the requests' delta (x-ratelimit-remaining-requests)
//     shows to be consecutive at the provider (deltas.go).

// Units is the size of one request as the kinds of upstream count it.
type Units struct {
	// In is the prompt as the gateway counts it: exact for OpenAI models,
	// the estimate or the upstream's count_tokens for others.
	In int64
	// RateIn is the prompt as OpenAI's and Azure OpenAI's rate limiters
	// estimate it (aitoken's RateLimitTokens), 0 when not known.
	RateIn int64
	// Out is the completion budget reserved (max_tokens × choices).
	Out int64
}

// Ratio bounds and the least base a learned ratio is used from.
const (
	minRatio = 0.25
	maxRatio = 4
	// minRatioBase is the least input, summed over the last period, a
	// ratio is learned from: below it a few samples would swing it.
	minRatioBase = 256
	// ratioLogRate is the rate of the sums' logs: far above any sum.
	ratioLogRate = 1 << 40
)

// ratioState is a target's learned ratio and its samples not yet in the
// store.
type ratioState struct {
	// value is the ratio ×1e6, 0 when none was learned (1); at (unix
	// nanos) when it was last read from the store.
	value, at atomic.Int64
	// busy is held while a store call on the sums runs.
	busy sync.Mutex
	mu   sync.Mutex
	// prov and base are the samples since the last flush.
	prov, base int64
	// deltas' state (deltas.go).
	last lastAnswer
}

// baseIn is the input u reserves on t before its learned ratio.
func (t *TargetState) baseIn(u Units) int64 {
	switch t.Up.Kind {
	case OpenAI, Azure:
		return max(u.In, u.RateIn)
	}
	return u.In
}

// Ratio returns t's learned ratio of provider-counted to base input, 1
// when none was learned.
func (t *TargetState) Ratio() float64 {
	if v := t.ratio.value.Load(); v > 0 {
		return float64(v) / 1e6
	}
	return 1
}

// inputOf is the input u reserves on t: its base times the learned
// ratio, rounded up, at least 0.
func (t *TargetState) inputOf(u Units) int64 {
	b := max(t.baseIn(u), 0)
	r := t.Ratio()
	if r == 1 || b == 0 {
		return b
	}
	f := math.Ceil(float64(b) * r)
	if f >= math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return int64(f)
}

// ratioReqs are the store requests of the sums' logs of t, charging prov
// and base.
func (p *Pool) ratioReqs(t *TargetState, prov, base int64) []sluice.Request {
	lim := sluice.Limit{Rate: ratioLogRate, Period: p.period, Granularity: slotOf(p.period)}
	return []sluice.Request{
		{Key: t.keyBase + "ratio:prov", Algorithm: sluice.SlidingWindowLog, Limit: lim, Cost: prov},
		{Key: t.keyBase + "ratio:base", Algorithm: sluice.SlidingWindowLog, Limit: lim, Cost: base},
	}
}

// sample records that t's provider counted prov input tokens of a request
// whose base input was base. Samples go to the store at most once a slot
// per replica, now when urgent (a provider refusal), in the background.
func (p *Pool) sample(ctx context.Context, t *TargetState, prov, base int64, urgent bool) {
	if prov <= 0 || base <= 0 || !t.CountsTokens() {
		return // a target without token limits has no use for a ratio
	}
	prov, base = min(prov, ratioLogRate/1024), min(base, ratioLogRate/1024)
	rs := &t.ratio
	rs.mu.Lock()
	rs.prov += prov
	rs.base += base
	rs.mu.Unlock()
	if !urgent && p.now().UnixNano()-rs.at.Load() < int64(p.slot()) {
		return
	}
	p.syncRatio(ctx, t, urgent)
}

// refreshRatio reads t's ratio from the store when this replica last read
// it more than a twentieth of a period ago (in the background: at most 20
// store calls a period per upstream model and replica), when t limits
// tokens.
func (p *Pool) refreshRatio(ctx context.Context, t *TargetState, now time.Time) {
	if now.UnixNano()-t.ratio.at.Load() < int64(p.period/20) || !t.CountsTokens() {
		return
	}
	p.syncRatio(ctx, t, false)
}

// syncRatio adds this replica's pending samples to t's sums in the store
// (a peek when there are none) and sets the ratio from what they hold:
// in the background, skipped while another call runs, or, when wait,
// after that call and before returning.
func (p *Pool) syncRatio(ctx context.Context, t *TargetState, wait bool) {
	rs := &t.ratio
	if wait {
		rs.busy.Lock() // after the call in flight: its samples may predate ours
	} else if !rs.busy.TryLock() {
		return
	}
	rs.at.Store(p.now().UnixNano())
	run := func(ctx context.Context) {
		defer rs.busy.Unlock()
		rs.mu.Lock()
		prov, base := rs.prov, rs.base
		rs.prov, rs.base = 0, 0
		rs.mu.Unlock()
		op := sluice.OpCharge
		if prov == 0 && base == 0 {
			op = sluice.OpPeek
		}
		ds, err := p.store.ApplyAll(ctx, op, p.ratioReqs(t, prov, base))
		if err != nil || len(ds) != 2 {
			rs.mu.Lock()
			rs.prov, rs.base = rs.prov+prov, rs.base+base // next time
			rs.mu.Unlock()
			return
		}
		usedProv, usedBase := ratioLogRate-ds[0].Remaining, ratioLogRate-ds[1].Remaining
		old := t.Ratio()
		r := 1.0
		if usedBase >= minRatioBase && usedProv > 0 {
			r = math.Max(minRatio, math.Min(maxRatio, float64(usedProv)/float64(usedBase)))
		}
		t.ratio.value.Store(int64(r * 1e6))
		if r > old {
			t.drop() // a chunk sized at the lower ratio
		}
		if p.metrics != nil {
			p.metrics.ratio.WithLabelValues(t.Up.Name, t.Model).Set(r)
		}
	}
	if wait {
		// Within the caller's deadline: a client waits for it.
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		run(wctx)
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	p.background.Add(1)
	go func() {
		defer p.background.Done()
		defer cancel()
		run(sctx)
	}()
}

// Refusal says whose a provider's 429 is.
type Refusal int

// The kinds of provider 429.
const (
	// RefusalGeneral is the provider's limit reached by the traffic as a
	// whole (or one the answer does not attribute): the upstream model
	// cools for everyone.
	RefusalGeneral Refusal = iota
	// RefusalUndercount is a request the pool counted below what the
	// provider counts, refused for its own size: the estimate is
	// corrected, the client refused, the upstream not cooled.
	RefusalUndercount
	// RefusalTooLarge is a request larger than the provider's whole
	// limit: it can never go to that upstream model, which is not cooled.
	RefusalTooLarge
)

// Judge tells whose a provider's 429 answer to g is, from its body and
// headers, and learns from it. OpenAI and Azure word a token refusal with
// the request's own count (their 429 bodies, error.type "tokens", code
// "rate_limit_exceeded", as in "Rate limit reached for gpt-4o in
// organization org-... on tokens per min (TPM): Limit 30000, Used 14567,
// Requested 24754." and "Request too large for gpt-4o ... Limit 30000,
// Requested 30601. The input or output tokens must be reduced"; see
// https://platform.openai.com/docs/guides/error-codes and
// https://platform.openai.com/docs/guides/rate-limits): a request larger
// than the limit is RefusalTooLarge; one the provider counts above its
// reservation is RefusalUndercount, and its count a sample of the ratio,
// sent to the store before Judge returns. Without a count (Anthropic's
// rate_limit_error, https://docs.anthropic.com/en/api/errors, names no
// number), a refusal though every token limit the provider reported
// (x-ratelimit-remaining-tokens, anthropic-ratelimit-*-remaining) had at
// least the reservation's part of it left is the request's own size:
// RefusalUndercount, and more than the input left a lower bound of its
// count.
// A refusal on requests (error.type "requests"), or with less left than
// the reservation, is RefusalGeneral. Judge sets g's refusal, which
// Observe reads.
func (p *Pool) Judge(ctx context.Context, g *Grant, h http.Header, body []byte) Refusal {
	t := g.Target
	var e struct {
		Error struct {
			Type    string `json:"type"`
			Code    any    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	msg := e.Error.Message
	baseIn := g.base
	kind := RefusalGeneral
	switch {
	case e.Error.Type == "requests" || strings.Contains(msg, "requests per min"):
		// The request limit: the traffic's, not this request's size.
	case strings.Contains(msg, "Requested "):
		n := numberAfter(msg, "Requested ")
		lim := numberAfter(msg, "Limit ")
		switch {
		case n <= 0:
		case strings.HasPrefix(msg, "Request too large") || (lim > 0 && n > lim):
			kind = RefusalTooLarge
			p.sample(ctx, t, n-g.out, baseIn, true)
		case n > g.in+g.out:
			kind = RefusalUndercount
			p.sample(ctx, t, n-g.out, baseIn, true)
		}
	default:
		// Every token limit the provider reports had room for the
		// reservation's part of it: the input was counted above it.
		rl := readHeaders(h, p.now())
		cs := costs(g.in, g.out)
		reported, fits := false, true
		inLeft := int64(math.MaxInt64)
		for _, i := range []int{limTPM, limITPM, limOTPM} {
			if rl.remaining[i] < 0 {
				continue
			}
			reported = true
			fits = fits && rl.remaining[i] >= cs[i]
			switch i {
			case limTPM:
				inLeft = min(inLeft, rl.remaining[i]-g.out)
			case limITPM:
				inLeft = min(inLeft, rl.remaining[i])
			}
		}
		if reported && fits && g.in+g.out > 0 {
			kind = RefusalUndercount
			if inLeft < math.MaxInt64 {
				p.sample(ctx, t, inLeft+1, baseIn, true)
			}
		}
	}
	g.refusal = kind
	if kind != RefusalGeneral && p.metrics != nil {
		p.metrics.ownRefusals.WithLabelValues(t.Up.Name, t.Model).Inc()
	}
	return kind
}

// numberAfter is the integer after the first prefix in s (commas
// allowed), -1 when none.
func numberAfter(s, prefix string) int64 {
	i := strings.Index(s, prefix)
	if i < 0 {
		return -1
	}
	s = s[i+len(prefix):]
	j := 0
	for j < len(s) && j < 24 && (s[j] >= '0' && s[j] <= '9' || s[j] == ',') {
		j++
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(s[:j], ",", ""), 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// RetryAfter is the wait a provider's 429 asks for (its Retry-After,
// retry-after-ms or reset headers, bounded; headers.go), DefaultCooldown
// when it names none.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	return cooldownOf(h, readHeaders(h, now), now)
}
