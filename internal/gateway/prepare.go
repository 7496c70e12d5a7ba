package gateway

// The OpenAI ingress stage: the body read (bounded), parsed (request.go),
// its tokens estimated and its reservation computed; streams made to report
// usage.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// prepare reads and parses the body, estimates the tokens, computes the
// reservation and rewrites stream_options. It answers the client itself and
// reports false on error.
func (g *Gateway) prepare(w http.ResponseWriter, r *http.Request, c *call) bool {
	if enc := encodedBody(r.Header); enc != "" {
		// The gateway reads the bytes as JSON; an upstream would decode
		// them first, and could read another request (raw deflate and
		// brotli streams can be made that are also valid JSON).
		w.Header().Set("x-should-retry", "false")
		writeError(w, http.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_content_encoding", "",
			fmt.Sprintf("Content-Encoding %q is not supported by the gateway; send the body uncompressed.", truncateName(enc)))
		return false
	}
	// The listener has no read timeout (a stream lasts as long as the
	// upstream's, and net/http cancels a request whose read deadline
	// passes), so the body gets its own deadline, lifted once it is read.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(g.bodyTimeout))
	body, err := readBody(http.MaxBytesReader(w, r.Body, g.cfg.MaxBodyBytes), r.ContentLength, g.cfg.MaxBodyBytes)
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusRequestTimeout, "invalid_request_error", "request_timeout", "",
				fmt.Sprintf("The request body did not arrive within %s.", g.bodyTimeout))
		} else if errors.As(err, &tooBig) {
			w.Header().Set("x-should-retry", "false")
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_body_too_large", "",
				fmt.Sprintf("Request body exceeds the gateway's limit of %d bytes.", g.cfg.MaxBodyBytes))
		} else {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "Could not read the request body.")
		}
		return false
	}
	if c.ep.anthropic() {
		return g.prepareAnthropic(w, r, c, body)
	}
	var p parsedBody
	if perr := parseBodyInto(&p, body, c.ep, g.tokenCache); perr != nil {
		w.Header().Set("x-should-retry", "false")
		writeError(w, http.StatusBadRequest, "invalid_request_error", perr.code, perr.param, perr.msg)
		return false
	}
	c.model, c.rawModel = p.model, p.model
	if !g.models[c.model] {
		c.model = "other"
	}
	c.stream = p.stream
	c.cacheKey = p.cacheKey
	if p.explicit {
		c.maxTokens = p.budget
	}
	c.promptEst = p.promptEst
	if g.pool != nil {
		c.rateIn = p.rateLimitTokens()
	}
	c.bud.serviceTier = p.serviceTier
	c.background = p.background
	c.bud.audio = p.audio
	budget := p.budget
	if c.ep != epEmbeddings && !p.explicit {
		budget = g.cfg.DefaultMaxTokens
	}
	c.reserved = reservation(c.promptEst, budget, p.choices)
	c.body = body
	if c.stream && (c.ep == epChat || c.ep == epCompletions) {
		rawSO, present := p.streamOptions, p.streamOptions != nil
		var so map[string]json.RawMessage
		if present && string(rawSO) != "null" {
			if json.Unmarshal(rawSO, &so) != nil || so == nil {
				writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_type", "stream_options", "stream_options must be an object.")
				return false
			}
		}
		c.wantUsage = string(so["include_usage"]) == "true"
		if !c.wantUsage && !present {
			// No stream_options: add it in place, without re-encoding
			// the body.
			c.body = insertIncludeUsage(body)
		} else if !c.wantUsage {
			if so == nil {
				so = map[string]json.RawMessage{}
			}
			so["include_usage"] = json.RawMessage("true")
			var members map[string]json.RawMessage
			if json.Unmarshal(body, &members) != nil {
				writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "", "The request body must be a JSON object.")
				return false
			}
			members["stream_options"], _ = json.Marshal(so)
			c.body, _ = json.Marshal(members)
		}
	}
	if !p.explicit {
		// A default budget must not make a request too large that would fit.
		for i := range c.client.tier.specs {
			s := &c.client.tier.specs[i]
			if s.kind == kindTokens && s.applies(p.model) {
				g.clampDefaultBudget(c, s)
			}
		}
		if lv := c.client.levels; lv != nil { // and the team's and org's (levels.go)
			for i := range lv.specs {
				if s := &lv.specs[i]; s.kind == kindTokens && s.applies(p.model) {
					g.clampDefaultBudget(c, s)
				}
			}
		}
		if c.ep != epEmbeddings {
			// Whole tokens per choice, so that forwardCap's cap bounds the
			// completion to exactly what is reserved.
			c.defaultCap = max((c.reserved-c.promptEst)/p.choices, 1)
			c.reserved = reservation(c.promptEst, c.defaultCap, p.choices)
		}
		if c.background && !forwardCap(w, c) {
			// Its usage may never pass the gateway (settle keeps the
			// reservation): the upstream must not generate past it.
			return false
		}
	}
	c.reserved = max(c.reserved, 1)
	return true
}

// encodedBody returns the request's Content-Encoding when it names any
// coding but identity, or "".
func encodedBody(h http.Header) string {
	for _, v := range h.Values("Content-Encoding") {
		for _, enc := range strings.Split(v, ",") {
			if enc = strings.TrimSpace(enc); enc != "" && !strings.EqualFold(enc, "identity") {
				return v
			}
		}
	}
	return ""
}

// includeUsageMember is what insertIncludeUsage adds to a request body.
const includeUsageMember = `"stream_options":{"include_usage":true},`

// bodyTimeout is how long a request body may take to arrive: 8 MiB at
// about 1 Mbit/s.
const bodyTimeout = time.Minute

// readBody reads a request body whose length is known, or not (-1), in
// one allocation when it is known, with room for includeUsageMember.
func readBody(r io.Reader, length, limit int64) ([]byte, error) {
	size := int64(512)
	if length >= 0 && length <= limit {
		size = length + int64(len(includeUsageMember)) + 1 // +1: the read of EOF
	}
	b := make([]byte, 0, size)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// insertIncludeUsage adds includeUsageMember as the first member of body, a
// JSON object with at least one member and no stream_options, reusing
// body's spare capacity.
func insertIncludeUsage(body []byte) []byte {
	at := bytes.IndexByte(body, '{') + 1 // only white space comes before it
	n := len(body)
	body = append(body, includeUsageMember...)
	copy(body[at+len(includeUsageMember):], body[at:n])
	copy(body[at:], includeUsageMember)
	return body
}
