package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/memstore"
)

func setup(t *testing.T, limit sluice.Limit, key httplimit.KeyFunc) (*httptest.Server, *clock.Fake, *memstore.Store) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store, _ := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	lim, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.New(httplimit.Options{Limiter: lim, Key: key, Policy: "api"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)
	return srv, clk, store
}

func get(t *testing.T, url string, hdr map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestMiddlewareDeniesWith429AndHeaders(t *testing.T) {
	srv, clk, _ := setup(t, sluice.Limit{Rate: 2, Period: 3 * time.Second}, nil)
	for i := range 2 {
		resp := get(t, srv.URL, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		if got := resp.Header.Get("X-RateLimit-Remaining"); got != []string{"1", "0"}[i] {
			t.Fatalf("request %d remaining %q", i, got)
		}
	}
	resp := get(t, srv.URL, nil)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third request: %d", resp.StatusCode)
	}
	want := map[string]string{
		"Retry-After":           "2", // 1.5s rounded up
		"X-RateLimit-Limit":     "2",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "3",
		"RateLimit-Policy":      `"api";q=2;w=3;sluice-burst=2`,
		"RateLimit":             `"api";r=0;t=2`, // the next request's worth in 1.5s
		"Content-Type":          "application/json",
	}
	for k, v := range want {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	var body struct {
		Error        string `json:"error"`
		Message      string `json:"message"`
		RetryAfterMS int64  `json:"retry_after_ms"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if body.Error != "rate_limited" || body.RetryAfterMS != 1500 || !strings.Contains(body.Message, "2/3s") {
		t.Fatalf("body %+v", body)
	}
	clk.Advance(1500 * time.Millisecond)
	if resp := get(t, srv.URL, nil); resp.StatusCode != 200 {
		t.Fatalf("after Retry-After: %d", resp.StatusCode)
	}
}

func TestByHeaderHashesKeys(t *testing.T) {
	srv, _, store := setup(t, sluice.PerMinute(1), httplimit.ByHeader("Authorization"))
	if resp := get(t, srv.URL, nil); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("missing key: %d", resp.StatusCode)
	}
	if resp := get(t, srv.URL, map[string]string{"Authorization": "Bearer sk-secret-1"}); resp.StatusCode != 200 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	if resp := get(t, srv.URL, map[string]string{"Authorization": "Bearer sk-secret-1"}); resp.StatusCode != 429 {
		t.Fatalf("same key again: %d", resp.StatusCode)
	}
	if resp := get(t, srv.URL, map[string]string{"Authorization": "Bearer sk-secret-2"}); resp.StatusCode != 200 {
		t.Fatalf("another key: %d", resp.StatusCode)
	}
	// the store holds the hash, not the key
	d, err := store.Apply(context.Background(), sluice.OpPeek, sluice.Request{Key: "key:" + sluice.HashKey("sk-secret-1"), Algorithm: sluice.GCRA, Limit: sluice.PerMinute(1)})
	if err != nil || d.Remaining != 0 {
		t.Fatalf("hashed key not charged: %+v %v", d, err)
	}
}

// TestKeyFuncsBypass: spellings of one key share its limit, keys that
// differ in any byte do not, and a client cannot mint IPv6 identities.
func TestKeyFuncsBypass(t *testing.T) {
	byHeader := httplimit.ByHeader("Authorization")
	keyOf := func(v string) (string, error) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", v)
		return byHeader(r)
	}
	want, _ := keyOf("Bearer sk-1")
	for _, v := range []string{"bearer sk-1", "BEARER   sk-1", "Bearer\tsk-1", " Bearer sk-1 "} {
		if got, err := keyOf(v); err != nil || got != want {
			t.Errorf("%q keyed %q, %v; want the key of \"Bearer sk-1\"", v, got, err)
		}
	}
	for _, v := range []string{"Bearer", "bearer  ", ""} {
		if got, err := keyOf(v); !errors.Is(err, httplimit.ErrNoKey) {
			t.Errorf("%q keyed %q, %v; want ErrNoKey", v, got, err)
		}
	}
	a, _ := keyOf("Bearer k\xff")
	b, _ := keyOf("Bearer k\xfe")
	if a == b {
		t.Error("keys that differ in an invalid UTF-8 byte share a limit")
	}

	byIP := httplimit.ByClientIP(netip.MustParsePrefix("10.0.0.0/8"))
	ipKey := func(remote, xff string) string {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		k, err := byIP(r)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	if k1, k2 := ipKey("[2001:db8:1:2::1]:1", ""), ipKey("[2001:db8:1:2:ffff::9]:1", ""); k1 != k2 || k1 != "ip:2001:db8:1:2::/64" {
		t.Errorf("one /64, two keys: %s %s", k1, k2)
	}
	if k1, k2 := ipKey("[2001:db8:1:2::1]:1", ""), ipKey("[2001:db8:1:3::1]:1", ""); k1 == k2 {
		t.Errorf("two /64s, one key: %s", k1)
	}
	if k := ipKey("10.0.0.1:1", "2001:db8:9:9::5"); k != "ip:2001:db8:9:9::/64" {
		t.Errorf("forwarded IPv6: %s", k)
	}
	// A header of thousands of trusted hops is walked only so far.
	long := strings.Repeat("10.0.0.9, ", 10000) + "10.0.0.8"
	if k := ipKey("10.0.0.1:1", long); k != "ip:10.0.0.9" {
		t.Errorf("long chain: %s", k)
	}
}

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("fe80::/10")}
	cases := []struct {
		remote, xff, want string
	}{
		{"203.0.113.9:5555", "", "203.0.113.9"},
		{"203.0.113.9:5555", "1.2.3.4", "203.0.113.9"}, // untrusted peer: header ignored
		{"10.0.0.2:80", "198.51.100.7", "198.51.100.7"},
		{"10.0.0.2:80", "6.6.6.6, 198.51.100.7, 10.0.0.3", "198.51.100.7"}, // spoofed first hop ignored
		{"10.0.0.2:80", "10.0.0.5, 10.0.0.3", "10.0.0.5"},
		{"10.0.0.2:80", "garbage, 198.51.100.7", "198.51.100.7"},
		{"[::ffff:203.0.113.9]:1", "", "203.0.113.9"},
		// Hops with ports and brackets, as some proxies write them.
		{"10.0.0.2:80", "198.51.100.7:4711", "198.51.100.7"},
		{"10.0.0.2:80", "6.6.6.6, 198.51.100.7:4711, 10.0.0.3:80", "198.51.100.7"},
		{"10.0.0.2:80", "[2001:db8::7]:443", "2001:db8::7"},
		{"10.0.0.2:80", "[2001:db8::7]", "2001:db8::7"},
		{"10.0.0.2:80", "[::ffff:198.51.100.7]:1", "198.51.100.7"},
		{"10.0.0.2:80", "fe80::7%eth0", "fe80::7"},
		{"10.0.0.2:80", "198.51.100.7, [198.51.100.8]", "10.0.0.2"},     // not a form anyone writes
		{"10.0.0.2:80", "198.51.100.7, 198.51.100.8:99999", "10.0.0.2"}, // port out of range
		{"10.0.0.2:80", "198.51.100.7, [2001:db8::7", "10.0.0.2"},       // unclosed
		{"[fe80::1%eth0]:80", "198.51.100.7", "198.51.100.7"},           // a zoned peer in a trusted prefix
	}
	for _, c := range cases {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = c.remote
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		got, err := httplimit.ClientIP(r, trusted)
		if err != nil || got.String() != c.want {
			t.Errorf("ClientIP(%s, XFF %q) = %v, %v; want %s", c.remote, c.xff, got, err, c.want)
		}
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "not-an-ip"
	if _, err := httplimit.ClientIP(r, trusted); !errors.Is(err, httplimit.ErrNoKey) {
		t.Errorf("bad remote: %v", err)
	}
}

// failing is a Store whose backend is down.
type failing struct{}

var errDown = errors.New("store down")

func (failing) Apply(context.Context, sluice.Op, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, errDown
}
func (failing) ApplyAll(context.Context, sluice.Op, []sluice.Request) ([]sluice.Decision, error) {
	return nil, errDown
}

func TestStoreFailure(t *testing.T) {
	lim, _ := sluice.NewLimiter(sluice.Options{Store: failing{}, Limit: sluice.PerSecond(1)})
	for _, open := range []bool{false, true} {
		mw, _ := httplimit.New(httplimit.Options{Limiter: lim, FailOpen: open, Logger: discard()})
		rec := httptest.NewRecorder()
		mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) })).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		want := 503
		if open {
			want = 204
		}
		if rec.Code != want {
			t.Errorf("FailOpen=%v: status %d, want %d", open, rec.Code, want)
		}
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := httplimit.New(httplimit.Options{}); err == nil {
		t.Fatal("nil limiter accepted")
	}
}

// IPv4 clients are keyed by address, IPv6 clients by their block: /64 by
// IPKey, the caller's length by IPBlockKey; a mapped IPv4 address is its
// IPv4 address, and a zone does not make another client.
func TestIPBlockKey(t *testing.T) {
	for _, c := range []struct {
		addr string
		bits int
		want string
	}{
		{"192.0.2.7", 48, "192.0.2.7"},
		{"::ffff:192.0.2.7", 64, "192.0.2.7"},
		{"2001:db8:1:2:3:4:5:6", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:3:4:5:6", 48, "2001:db8:1::/48"},
		{"fe80::1%eth0", 64, "fe80::/64"},
		{"2001:db8::1", 200, "2001:db8::1/128"},
	} {
		if got := httplimit.IPBlockKey(netip.MustParseAddr(c.addr), c.bits); got != c.want {
			t.Errorf("IPBlockKey(%s, %d) = %s, want %s", c.addr, c.bits, got, c.want)
		}
	}
	if got := httplimit.IPKey(netip.MustParseAddr("2001:db8:1:2::9")); got != "2001:db8:1:2::/64" {
		t.Errorf("IPKey = %s", got)
	}
}

// TestBadCostIsRefused: a cost the request itself sets (here from a
// header) that the limiter refuses, zero or negative, is the caller's
// error: 400, never passed on, even with FailOpen, which is for a limiter
// that cannot answer. So is an empty key. A cost over the burst stays 413.
func TestBadCostIsRefused(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store, _ := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	lim, _ := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.PerSecond(1)})
	cost := func(r *http.Request) int64 {
		n, _ := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
		return n
	}
	key := func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }
	for _, open := range []bool{false, true} {
		mw, err := httplimit.New(httplimit.Options{Limiter: lim, Key: key, Cost: cost, FailOpen: open, Logger: discard()})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			user, cost string
			want       int
		}{
			{"u", "0", 400},
			{"u", "-1", 400},
			{"u", "-9223372036854775808", 400},
			{"u", "not a number", 400},
			{"", "1", 400},
			{"u", "2", 413},
			{"u", "1", 204},
			{"u", "1", 429},
		} {
			passed := false
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-User", c.user)
			req.Header.Set("X-Cost", c.cost)
			mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { passed = true; w.WriteHeader(204) })).ServeHTTP(rec, req)
			if rec.Code != c.want || passed != (c.want == 204) {
				t.Errorf("FailOpen=%v, user %q, cost %q: status %d (passed on: %v), want %d", open, c.user, c.cost, rec.Code, passed, c.want)
			}
		}
		clk.Advance(time.Second)
	}
}
