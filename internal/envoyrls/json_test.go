package envoyrls

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

func TestJSONEndpoint(t *testing.T) {
	e := newEnv(t, memStore, "testdata/config", func(o *Options) { o.ResponseHeaders = true })
	srv := httptest.NewServer(e.svc.JSONHandler())
	t.Cleanup(srv.Close)
	post := func(body string) (*http.Response, *rlsv3.RateLimitResponse) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		buf, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var out rlsv3.RateLimitResponse
		if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests {
			if err := protojson.Unmarshal(buf, &out); err != nil {
				t.Fatalf("decode %q: %v", buf, err)
			}
		}
		return resp, &out
	}
	// The request shape of envoyproxy/ratelimit's /json endpoint.
	body := `{"domain":"test-domain","descriptors":[{"entries":[{"key":"key3","value":"j"}]}]}`
	resp, out := post(body)
	if resp.StatusCode != http.StatusOK || out.GetOverallCode() != rlsv3.RateLimitResponse_OK ||
		out.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 1 {
		t.Fatalf("first: %d %v", resp.StatusCode, out)
	}
	resp, out = post(body)
	if resp.StatusCode != http.StatusTooManyRequests || out.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second: %d %v", resp.StatusCode, out)
	}
	if resp.Header.Get("Retry-After") != "3590" {
		t.Errorf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	for _, c := range []struct {
		body string
		code int
	}{
		{`{"domain":`, http.StatusBadRequest},
		{`{"domain":"x","descriptors":[],"bogus":1}`, http.StatusBadRequest},
		{`{"domain":"test-domain"}`, http.StatusBadRequest},
		{`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"` + strings.Repeat("x", maxJSONBody) + `"}]}]}`, http.StatusRequestEntityTooLarge},
	} {
		if resp, _ := post(c.body); resp.StatusCode != c.code {
			t.Errorf("%.40s: status %d, want %d", c.body, resp.StatusCode, c.code)
		}
	}
	resp, err := http.Get(srv.URL + "/json")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", resp.StatusCode)
	}
}
