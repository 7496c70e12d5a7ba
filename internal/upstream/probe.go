package upstream

// Dead upstreams. A request that could not reach an upstream (the
// connection refused or never made: DNS, dial timeout, TLS; the request
// never written) marks the upstream unreachable on this replica
// (Unreachable): no client request is sent to any of its models until a
// probe, the gateway's own request, gets an answer. Probes are the
// cheapest read the upstream's API offers, GET {base_url}/models
// (OpenAI, OpenAI-compatible, Anthropic; Azure OpenAI:
// {base_url}/openai/models?api-version=...), or Def.HealthPath, with the
// upstream's key; they run under exponential backoff with equal jitter,
// from ProbeMin doubling to ProbeMax, each bounded by probeTimeout. Any
// answer below 500 (a 401 or 404 too: the server is there) brings the
// upstream back; a 5xx, or no answer, is another failed probe. The
// 5xx and timeout circuit (Fail) is separate: it is about an upstream
// that answers badly, not one that cannot be reached.

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

// ErrUnreachable means every upstream of a route serving the request's
// API is unreachable (Unreachable) and being probed: none is expected
// back at any known time.
var ErrUnreachable = errors.New("upstream: every upstream of the route is unreachable")

// Probe backoff defaults: the first probe DefaultProbeMin after the
// failure (with jitter), each next one twice as late, at most
// DefaultProbeMax apart: an upstream that is back (or a network that is
// back after an outage that cut every upstream) returns to rotation within
// about DefaultProbeMax, at the cost of one cheap GET per upstream that
// often while it is down.
const (
	DefaultProbeMin = 500 * time.Millisecond
	DefaultProbeMax = 10 * time.Second
	probeTimeout    = 5 * time.Second
	// maxProbeBody bounds what is read of a probe's answer.
	maxProbeBody = 64 << 10
)

// health is an upstream's reachability on this replica.
type health struct {
	// dead is set from the failure until a probe is answered; the one
	// who sets it runs the probes.
	dead atomic.Bool
	// since and next (unix nanos) are when it was found unreachable and
	// when the next probe goes, for /v1/status.
	since, next atomic.Int64
	// probes counts the probes sent since it was found unreachable.
	probes atomic.Int64
}

// Reachable reports whether u is in rotation on this replica: false from
// a connection failure until a probe is answered.
func (u *Upstream) Reachable() bool { return !u.health.dead.Load() }

// ProbeState returns, for an unreachable u, since when, the probes sent
// and when the next goes; zero times when u is reachable.
func (u *Upstream) ProbeState() (since time.Time, probes int64, next time.Time) {
	if u.Reachable() {
		return time.Time{}, 0, time.Time{}
	}
	return time.Unix(0, u.health.since.Load()), u.health.probes.Load(), time.Unix(0, u.health.next.Load())
}

// Unreachable takes t's upstream out of rotation on this replica after a
// request could not reach it, and starts probing it; a no-op when it is
// already out. Its models' leased chunks are dropped.
func (p *Pool) Unreachable(t *TargetState) {
	u := t.Up
	if !u.health.dead.CompareAndSwap(false, true) {
		return
	}
	u.health.since.Store(time.Now().UnixNano())
	u.health.probes.Store(0)
	for _, r := range p.routes {
		for _, ts := range r.Targets {
			if ts.Up == u {
				ts.drop()
			}
		}
	}
	if p.metrics != nil {
		p.metrics.unreachable.WithLabelValues(u.Name).Inc()
	}
	p.probing.Add(1)
	go p.probe(u)
}

// probe probes u until it answers or the pool closes, then puts it back.
func (p *Pool) probe(u *Upstream) {
	defer p.probing.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	step := p.probeMin
	for {
		// Equal jitter: half the step, and up to as much again at
		// random, so that replicas that lost an upstream together do
		// not probe it together.
		wait := step/2 + rand.N(step/2+1)
		u.health.next.Store(time.Now().Add(wait).UnixNano())
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return
		}
		u.health.probes.Add(1)
		ok := p.probeOnce(ctx, u)
		if p.metrics != nil {
			p.metrics.probes.WithLabelValues(u.Name, map[bool]string{true: "up", false: "down"}[ok]).Inc()
		}
		if ok {
			u.health.dead.Store(false)
			return
		}
		step = min(2*step, p.probeMax)
	}
}

// probeOnce sends u's health request and reports whether u answered
// below 500.
func (p *Pool) probeOnce(ctx context.Context, u *Upstream) bool {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.base.String(), nil)
	if err != nil {
		return false
	}
	u.Point(req, "/v1/models")
	if u.healthPath != "" {
		hp, err := url.Parse(u.healthPath)
		if err != nil {
			return false
		}
		req.URL.Path = u.basePath + hp.Path
		req.URL.RawQuery = hp.RawQuery
	}
	res, err := p.prober.RoundTrip(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, maxProbeBody))
	_ = res.Body.Close()
	return res.StatusCode < 500
}

// Close stops the probes and waits for them to end. The pool must not be
// used after it.
func (p *Pool) Close() error {
	p.closeOnce.Do(func() { close(p.closing) })
	p.probing.Wait()
	return nil
}

// validHealthPath reports whether s is a health_path: an absolute path,
// with a query at most, of printable characters.
func validHealthPath(s string) bool {
	if !strings.HasPrefix(s, "/") || strings.HasPrefix(s, "//") || len(s) > 256 {
		return false
	}
	u, err := url.Parse(s)
	return err == nil && u.Scheme == "" && u.Host == "" && u.Fragment == "" && !strings.ContainsAny(s, " \t\r\n")
}
