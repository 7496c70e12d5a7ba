package gateway

// The relay stage: the request rewritten for the upstream, the round trip
// timed, the answer's limit headers replaced and its body wrapped to read
// usage as it is relayed (relay.go), and the upstream's failures answered.

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice/httplimit"
)

// rewrite turns the client's request into the upstream's.
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	out := pr.Out
	out.URL.Scheme = g.upstream.Scheme
	out.URL.Host = g.upstream.Host
	out.URL.Path = g.upstreamPath + strings.TrimPrefix(pr.In.URL.Path, "/v1")
	out.URL.RawPath = ""
	out.Host = g.upstream.Host
	// The client's credentials and identities stay here; the upstream
	// sees the gateway's key only.
	// Method overrides are dropped: the upstream must see the method the
	// gateway metered.
	for _, h := range []string{"Authorization", "Api-Key", "X-Api-Key", "Openai-Organization", "Openai-Project", "Cookie", "Accept-Encoding",
		"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"} {
		out.Header.Del(h)
	}
	if g.upstreamAuth != nil {
		out.Header["Authorization"] = g.upstreamAuth
	}
	g.rewriteAnthropic(out, pr.In.URL.Path)
	if g.pool != nil {
		// A routed request is pointed at its upstream per attempt
		// (poolTransport); others go to the first upstream.
		g.pool.Upstreams()[0].Point(out, pr.In.URL.Path)
	}
	if c := callFrom(pr.In.Context()); c != nil && c.body != nil {
		body := c.body
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		out.ContentLength = int64(len(body))
		out.Header["Content-Length"] = []string{strconv.Itoa(len(body))}
		// The gateway read the body as JSON: the upstream must too, not
		// as a form whose fields a JSON string could carry
		// ("content":"&max_tokens=100000&").
		out.Header["Content-Type"] = jsonContentType
	}
}

// jsonContentType is the Content-Type of every metered request sent
// upstream.
var jsonContentType = []string{"application/json"}

// timedTransport notes when the upstream round trip starts. A metered
// request's context carries c.up's trace (ServeHTTP), which notes whether the
// request was written (upstreamTrace.wroteRequest): set there, once, it costs no
// copy of the request per round trip.
type timedTransport struct{ next http.RoundTripper }

func (t timedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if c := callFrom(req.Context()); c != nil {
		c.sent = time.Now()
	}
	return t.next.RoundTrip(req)
}

// modifyResponse records the upstream's answer and wraps its body to read
// usage as it is relayed.
func (g *Gateway) modifyResponse(res *http.Response) error {
	c := callFrom(res.Request.Context())
	if c == nil {
		return nil
	}
	c.headersAt = time.Now()
	c.status = res.StatusCode
	// Our limits, not the upstream account's, are the client's: whatever
	// the status, the client sees one set of limit headers, ours.
	for k := range res.Header { // keys are canonical: the client parsed them
		if strings.HasPrefix(k, "X-Ratelimit-") || strings.HasPrefix(k, "Anthropic-Ratelimit-") || k == "Ratelimit" || k == "Ratelimit-Policy" {
			res.Header.Del(k)
		}
	}
	if c.ep == epNone {
		return nil
	}
	tierName := c.client.tier.name
	if res.StatusCode == http.StatusTooManyRequests || res.StatusCode >= 500 {
		// Passed through with the upstream's Retry-After; refunded at settle.
		c.rejected = true
		g.metrics.rejections.WithLabelValues(tierName, c.model, "upstream_"+strconv.Itoa(res.StatusCode)).Inc()
		return nil
	}
	if res.StatusCode/100 != 2 {
		return nil
	}
	if encodedBody(res.Header) != "" {
		// Encoded past what the transport decodes (it asks for gzip
		// only): its usage cannot be read; settle keeps the reservation.
		c.unread = true
		return nil
	}
	if strings.HasPrefix(strings.ToLower(res.Header.Get("Content-Type")), "text/event-stream") {
		res.Body = newSSEReader(res.Body, c)
	} else {
		res.Body = newCaptureReader(res.Body, c, res.ContentLength, defaultMaxResponseBytes)
	}
	return nil
}

// observeTimes records the upstream's time to headers and the gateway's
// overhead before it, from settle: off the client's path.
func (g *Gateway) observeTimes(c *call) {
	if c.sent.IsZero() || c.headersAt.IsZero() {
		return
	}
	tm := g.metrics.forTierModel(c.client.tier.name, c.model)
	tm.upstream.Observe(c.headersAt.Sub(c.sent).Seconds())
	tm.overhead.Observe(c.sent.Sub(c.start).Seconds())
}

// upstreamError answers when the upstream could not be reached or the
// response could not be relayed.
func (g *Gateway) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	c := callFrom(r.Context())
	if r.Context().Err() != nil {
		// The client went away; there is nobody to answer.
		if c != nil {
			c.canceled = true
		}
		return
	}
	if c != nil && c.noRoom > 0 {
		g.noRoom(w, c)
		return
	}
	if c != nil {
		c.unreachable = true
		var ne net.Error
		c.timedOut = errors.As(err, &ne) && ne.Timeout()
		if c.ep != epNone {
			g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, "upstream_unreachable").Inc()
		}
		g.log.Warn("gateway: upstream unreachable", "request_id", c.id, "client", c.client.id, "err", err)
	}
	writeError(w, http.StatusBadGateway, "server_error", "upstream_unreachable", "", "The gateway could not reach the upstream API; please retry.")
}

// noRoom answers a routed request whose last upstream could not be
// reached and for which no other upstream of its route has room before
// routing.deadline: 429 with when the first has room, as when none had
// room to begin with (acquire), not 502. A request no upstream had is
// refunded whole.
func (g *Gateway) noRoom(w http.ResponseWriter, c *call) {
	if c.wroteUpstream() {
		c.unreachable = true // an earlier attempt was sent: settled as one
	} else {
		c.unsent = true
	}
	c.status = http.StatusTooManyRequests
	g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, "upstream_capacity").Inc()
	h := w.Header()
	h.Set("Retry-After", strconv.FormatInt(int64(max((c.noRoom+time.Second-1)/time.Second, 1)), 10))
	h.Set("retry-after-ms", httplimit.RetryAfterMillis(max(c.noRoom, time.Millisecond)))
	writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded", "",
		"Every reachable upstream serving model "+c.rawModel+" is at its provider limit. Please try again in "+formatReset(c.noRoom)+".")
}
