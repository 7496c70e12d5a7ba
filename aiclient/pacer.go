package aiclient

import (
	"sync"
	"time"
)

// pacer slows a client down before the server rejects it. It remembers the
// last rate-limit headers seen, counts down locally the requests and tokens
// launched since, and asks a caller to wait when the server's limit would
// be exceeded. After a 429 it holds every caller of the client back until
// the retry time. It is shared by all the client's goroutines.
type pacer struct {
	mu       sync.Mutex
	until    int64 // no launch before this time (Unix ns)
	req, tok window
}

// window is a Window observed at a time, counted down locally.
type window struct {
	w       Window
	seenAt  int64 // Unix ns
	resetAt int64 // Unix ns; the observation is stale after it
}

func (w *window) wait(now, cost int64) time.Duration {
	if !w.w.Known || now >= w.resetAt {
		return 0
	}
	d := w.w.WaitFor(cost)
	if d <= 0 {
		return 0
	}
	return time.Duration(max(w.seenAt+int64(d)-now, 0))
}

// observe records the rate-limit headers of a response read at now.
func (p *pacer) observe(info RateLimitInfo, now int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if info.Requests.Known {
		p.req = window{w: info.Requests, seenAt: now, resetAt: now + int64(info.Requests.Reset)}
	}
	if info.Tokens.Known {
		p.tok = window{w: info.Tokens, seenAt: now, resetAt: now + int64(info.Tokens.Reset)}
	}
}

// holdUntil keeps every caller from launching before t.
func (p *pacer) holdUntil(t int64) {
	p.mu.Lock()
	p.until = max(p.until, t)
	p.mu.Unlock()
}

// reserve returns how long to wait before launching a request of tokens
// estimated tokens. When it returns zero it has counted the request down.
func (p *pacer) reserve(now, tokens int64) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now < p.until {
		return time.Duration(p.until - now)
	}
	d := max(p.req.wait(now, 1), p.tok.wait(now, tokens))
	if d > 0 {
		return d
	}
	if p.req.w.Known && now < p.req.resetAt {
		p.req.w.Remaining--
	}
	if p.tok.w.Known && now < p.tok.resetAt {
		p.tok.w.Remaining -= tokens
	}
	return 0
}
