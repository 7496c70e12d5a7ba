package upstream

import (
	"context"
	"net/http"
	"strings"
	"time"
)

// Samples from OpenAI's and Azure OpenAI's remaining counts. Their
// answers carry x-ratelimit-remaining-requests and -tokens, what was
// left right after the provider counted the request answered. When two
// answers one replica sees show one request fewer left, and nothing
// refilled in between, the second request arrived right after the first
// and the tokens' delta is the provider's count of it: its
// max_tokens × n and its input, a sample of the ratio (units.go).
//
// What refills in between is told by x-ratelimit-reset-tokens: a bucket
// refilled continuously (OpenAI's) reports the time to be whole again,
// (limit − remaining) / limit of the period, and refills limit × Δt /
// period, which is added; a window (Azure's minute, a sliding window)
// reports another time and frees nothing until a request leaves it,
// which also shows in the requests left. Of a bucket, pairs further apart
// than a request's refill (period / rpm) are not used: a refilled request
// would hide a second arrival. Of a window, a pair may mix k+1 arrivals
// and k departures, a sample as large on average as one request; the sums
// over a period smooth such samples, and the ratio stays within
// [minRatio, maxRatio].

// lastAnswer is the remaining counts of the last answer this replica saw
// from one target.
type lastAnswer struct {
	req, tok int64
	at       int64 // unix nanos; 0 when none
}

// observeDelta learns from the remaining counts rl of an OpenAI or Azure
// answer to g, seen at now.
func (p *Pool) observeDelta(ctx context.Context, g *Grant, rl rateHeaders, h http.Header, now time.Time) {
	t := g.Target
	if t.Up.Kind != OpenAI && t.Up.Kind != Azure {
		return
	}
	req, tok := rl.remaining[limRPM], rl.remaining[limTPM]
	lreq, ltok := rl.limit[limRPM], rl.limit[limTPM]
	if req < 0 || tok < 0 || lreq <= 0 || ltok <= 0 {
		return
	}
	rs := &t.ratio
	rs.mu.Lock()
	prev := rs.last
	rs.last = lastAnswer{req: req, tok: tok, at: now.UnixNano()}
	rs.mu.Unlock()
	dt := time.Duration(now.UnixNano() - prev.at)
	if prev.at == 0 || prev.req-req != 1 || tok == 0 || prev.tok == 0 || dt < 0 {
		return
	}
	cost := prev.tok - tok
	if bucketLike(h, ltok, tok, p.period) {
		if dt > p.period/time.Duration(lreq) {
			return // a refilled request may hide a second arrival
		}
		cost += int64(float64(ltok) * float64(dt) / float64(p.period))
	}
	if in := cost - g.out; in > 0 {
		p.sample(ctx, t, in, g.base, false)
	}
}

// bucketLike reports whether x-ratelimit-reset-tokens in h is a bucket's:
// the time to refill what is used, (limit − remaining) / limit of the
// period, within a tenth or 20 ms.
func bucketLike(h http.Header, limit, remaining int64, period time.Duration) bool {
	v := strings.TrimSpace(h.Get("X-Ratelimit-Reset-Tokens"))
	if v == "" || len(v) > 32 || v == strings.TrimSpace(h.Get("X-Ratelimit-Reset-Requests")) {
		// Both limits whole again at once: a window's end (a bucket's
		// requests and tokens refill apart).
		return false
	}
	reset, err := time.ParseDuration(v)
	if err != nil || reset < 0 {
		return false
	}
	want := time.Duration(float64(limit-remaining) / float64(limit) * float64(period))
	d := reset - want
	if d < 0 {
		d = -d
	}
	return d <= max(want/10, 20*time.Millisecond)
}
