package server

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/memstore"
)

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	for _, c := range []struct {
		remote string
		xff    []string
		want   string
	}{
		{"203.0.113.9:5000", nil, "203.0.113.9"},
		{"203.0.113.9:5000", []string{"1.2.3.4"}, "203.0.113.9"}, // untrusted peer: XFF ignored
		{"10.0.0.5:5000", []string{"1.2.3.4"}, "1.2.3.4"},
		{"10.0.0.5:5000", []string{"6.6.6.6, 1.2.3.4, 10.0.0.7"}, "1.2.3.4"}, // rightmost untrusted
		{"10.0.0.5:5000", []string{"6.6.6.6", "1.2.3.4"}, "1.2.3.4"},         // several headers
		{"10.0.0.5:5000", []string{"garbage, 1.2.3.4"}, "1.2.3.4"},
		{"10.0.0.5:5000", []string{"1.2.3.4, garbage"}, "10.0.0.5"}, // unparsable: stop at the last good hop
		{"10.0.0.5:5000", []string{"10.0.0.6"}, "10.0.0.6"},         // all trusted: leftmost
		{"[::1]:5000", []string{"2001:db8::1"}, "2001:db8::1"},
		{"[::ffff:203.0.113.9]:5000", nil, "203.0.113.9"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.remote
		for _, v := range c.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		got, err := httplimit.ClientIP(r, trusted)
		if err != nil || got.String() != c.want {
			t.Errorf("%s %v: %s, want %s", c.remote, c.xff, got, c.want)
		}
	}
	if got := ipIdentity(netip.MustParseAddr("2001:db8:1:2:3:4:5:6"), 64); got != "ip:2001:db8:1:2::/64" {
		t.Errorf("ipv6 identity %s", got)
	}
	if got := ipIdentity(netip.MustParseAddr("2001:db8:1:2:3:4:5:6"), 48); got != "ip:2001:db8:1::/48" {
		t.Errorf("ipv6 identity at /48: %s", got)
	}
	if got := ipIdentity(netip.MustParseAddr("192.0.2.7"), 48); got != "ip:192.0.2.7" {
		t.Errorf("ipv4 identity at /48: %s", got)
	}
}

func TestAPIKeyFrom(t *testing.T) {
	names := []string{"X-API-Key", "Authorization"}
	for _, c := range []struct {
		hdr  []string // name, value pairs, added in order
		want string
		err  bool
	}{
		{hdr: []string{"X-API-Key", "k1"}, want: "k1"},
		{hdr: []string{"Authorization", "Bearer k2"}, want: "k2"},
		{hdr: []string{"Authorization", "bearer  k3 "}, want: "k3"},
		{hdr: []string{"Authorization", "BEARER k3"}, want: "k3"},
		{hdr: []string{"Authorization", "bEaReR\tk3"}, want: "k3"},
		{hdr: []string{"X-API-Key", "Bearer k4"}, want: "k4"},
		{hdr: []string{"Authorization", "Basic dXNlcjpwYXNz"}, want: ""},
		{hdr: []string{"Authorization", "Bearer"}, want: ""},
		{hdr: []string{"Authorization", "Bearerk5"}, want: ""},
		{hdr: []string{"X-API-Key", "k6", "X-API-Key", "k6"}, want: "k6"},
		{hdr: []string{"X-API-Key", "k6", "X-API-Key", "k7"}, err: true},
		{hdr: []string{"Authorization", "Bearer k8", "Authorization", "Bearer k9"}, err: true},
		{hdr: []string{"Authorization", "Basic x", "Authorization", "Bearer k10"}, want: "k10"},
		{hdr: []string{"X-API-Key", "k11", "Authorization", "Bearer other"}, want: "k11"}, // configured order
	} {
		h := http.Header{}
		for i := 0; i+1 < len(c.hdr); i += 2 {
			h.Add(c.hdr[i], c.hdr[i+1])
		}
		keys, err := apiKeysFrom(h, names)
		got := ""
		if len(keys) > 0 {
			got = keys[0].key
		}
		if got != c.want || (err != nil) != c.err {
			t.Errorf("%q: %q, %v; want %q (error %v)", c.hdr, got, err, c.want, c.err)
		}
	}
}

func TestAppendString(t *testing.T) {
	for _, s := range []string{"plain", `q"b\`, "ctl\x00\x1f\x7f", "<&>", "bad\xffutf8", "é\u2028"} {
		var back string
		if err := json.Unmarshal(appendString(nil, s), &back); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if want := strings.ToValidUTF8(s, "\uFFFD"); back != want {
			t.Errorf("%q came back %q", s, back)
		}
	}
}

// FuzzCheck sends arbitrary bodies to /v1/check: every answer is JSON with
// a known status, and nothing panics.
func FuzzCheck(f *testing.F) {
	cfg, err := config.Parse("fuzz.yaml", []byte(testConfig))
	if err != nil {
		f.Fatal(err)
	}
	store, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := New(Options{Store: store, Config: cfg, Metrics: metrics.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		`{"policy":"free","key":"k"}`, `{"tier":"pro","key":"k","cost":3}`, `{"api_key":"sk-free-demo-0001"}`,
		`{"checks":[{"policy":"a","key":"x"},{"tier":"free","key":"y"}]}`, `{"cost":-1}`, `[]`, `null`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/v1/check", strings.NewReader(body)))
		switch rec.Code {
		case 200, 400, 401, 413, 429:
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body)
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("invalid JSON for %q: %s", body, rec.Body)
		}
	})
}
