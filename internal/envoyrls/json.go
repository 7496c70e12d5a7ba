package envoyrls

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds a /json request body.
const maxJSONBody = 1 << 20

// maxJSONObjects is the most JSON objects a /json request within the
// structural bounds holds: itself, and per descriptor the descriptor, its
// entries and its limit override.
const maxJSONObjects = 1 + maxDescriptors*(maxEntries+2)

// jsonObjects counts the objects ('{' outside strings) of a JSON text.
func jsonObjects(b []byte) int {
	n := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '{':
			n++
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		}
	}
	return n
}

// JSONHandler serves envoyproxy/ratelimit's /json endpoint: POST a
// RateLimitRequest in protobuf's JSON form, get the RateLimitResponse back,
// with status 200 when the overall code is OK, 429 when it is OVER_LIMIT,
// 400 for a malformed request and 500 when the store fails. A browser's
// cross-origin request gets 403 (net/http's CrossOriginProtection): a page
// on another site could otherwise spend any descriptor's limit with a
// text/plain POST, which no CORS preflight stops.
func (s *Service) JSONHandler() http.Handler {
	cop := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "envoyrls: /json takes POST", http.StatusMethodNotAllowed)
			return
		}
		if err := cop.Check(r); err != nil {
			http.Error(w, "envoyrls: cross-origin browser request refused: "+err.Error(), http.StatusForbidden)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
		if err != nil {
			code := http.StatusBadRequest
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				code = http.StatusRequestEntityTooLarge
			}
			http.Error(w, "envoyrls: read body: "+err.Error(), code)
			return
		}
		if n := jsonObjects(body); n > maxJSONObjects {
			// protojson makes some fifty bytes of every byte of "{},":
			// refused before it decodes, as gRPC's codec bounds its own.
			http.Error(w, fmt.Sprintf("envoyrls: bad request: %d JSON objects; a request within the bounds (%d descriptors of %d entries) has at most %d", n, maxDescriptors, maxEntries, maxJSONObjects), http.StatusBadRequest)
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			http.Error(w, "envoyrls: bad request: "+err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := s.check(r.Context(), &req, nil)
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, errInvalid) {
				code = http.StatusBadRequest
			}
			http.Error(w, err.Error(), code)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, "envoyrls: encode response: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		code := http.StatusOK
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			code = http.StatusTooManyRequests
			for _, h := range resp.GetResponseHeadersToAdd() {
				if h.GetKey() == "Retry-After" {
					w.Header().Set("Retry-After", h.GetValue())
				}
			}
		}
		w.WriteHeader(code)
		_, _ = w.Write(out)
	})
}
