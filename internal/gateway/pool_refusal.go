package gateway

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/upstream"
)

// A provider's 429 of one request for its own size (package upstream,
// Judge: a request the pool counted below what the provider counts, or
// larger than the provider's whole limit) is that client's problem: the
// pool's estimate is corrected (the learned ratio) and the client refused,
// and the upstream is not cooled, so that one client's oversized or
// undercounted requests never cost other clients a route. Only the
// provider's general 429 cools an upstream, and failures open its circuit.

// maxJudgedBody bounds the 429 body read to judge it.
const maxJudgedBody = 16 << 10

// judge reads the start of a provider 429's body and has the pool judge
// whose it is; the body is restored for whoever reads it next.
func (t poolTransport) judge(ctx context.Context, grant *upstream.Grant, res *http.Response) upstream.Refusal {
	b, _ := io.ReadAll(io.LimitReader(res.Body, maxJudgedBody))
	res.Body = readCloser{io.MultiReader(bytes.NewReader(b), res.Body), res.Body}
	jctx, cancel := context.WithTimeout(ctx, t.g.cfg.Store.Timeout)
	defer cancel()
	return t.g.pool.Judge(jctx, grant, res.Header, b)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// ownRefusal answers a client whose request a provider refused for its
// own size, in place of the provider's answer (which names the provider's
// organization and limits): 429 rate_limit_exceeded with the provider's
// Retry-After for an undercounted request, which the corrected estimate
// now reserves in full; 400 request_too_large for one larger than the
// upstream's whole limit. Anthropic's error shape on its paths.
func ownRefusal(c *call, provider *http.Response, kind upstream.Refusal, wait time.Duration) *http.Response {
	_, _ = io.Copy(io.Discard, io.LimitReader(provider.Body, 64<<10))
	_ = provider.Body.Close()
	status, typ, code := http.StatusTooManyRequests, "tokens", "rate_limit_exceeded"
	msg := "The provider counted this request's tokens above what the gateway reserved for it; the gateway's estimate is corrected. Please try again in " + formatReset(wait) + "."
	h := http.Header{}
	if kind == upstream.RefusalTooLarge {
		status, typ, code = http.StatusBadRequest, "invalid_request_error", "request_too_large"
		msg = "The request's tokens, as the provider counts them, exceed the upstream's limit for model " + c.rawModel + "; reduce the input or max_tokens."
		h.Set("x-should-retry", "false")
	} else {
		h.Set("Retry-After", strconv.FormatInt(int64(max((wait+time.Second-1)/time.Second, 1)), 10))
		h.Set("retry-after-ms", httplimit.RetryAfterMillis(max(wait, time.Millisecond)))
	}
	var body []byte
	if c.ep.anthropic() {
		body = marshalJSON(map[string]any{"type": "error", "error": map[string]string{"type": anthropicErrorType(status), "message": msg}})
	} else {
		body = marshalJSON(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}})
	}
	body = append(body, '\n')
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	return &http.Response{
		Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		Request: provider.Request,
	}
}
