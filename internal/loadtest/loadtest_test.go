package loadtest

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestHistogramQuantilesWithinOnePercent(t *testing.T) {
	h := NewHistogram()
	r := rand.New(rand.NewPCG(1, 2))
	samples := make([]int64, 100000)
	for i := range samples {
		samples[i] = int64(r.ExpFloat64() * 1e6)
		h.Record(time.Duration(samples[i]))
	}
	slices.Sort(samples)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
		exact := samples[int(q*float64(len(samples)))-1]
		got := int64(h.Quantile(q))
		if got < exact || float64(got-exact) > 0.01*float64(exact)+1 {
			t.Errorf("q%.3f = %d, exact %d", q, got, exact)
		}
	}
	if h.Count() != int64(len(samples)) || int64(h.Max()) != samples[len(samples)-1] {
		t.Errorf("count %d max %s", h.Count(), h.Max())
	}
	for v := int64(0); v < 1<<20; v += 7 {
		if b := bucketOf(v); bucketHigh(b) < v || (b > 0 && bucketHigh(b-1) >= v) {
			t.Fatalf("value %d in bucket %d [.., %d]", v, b, bucketHigh(b))
		}
	}
}

func TestRunCountsAndKeys(t *testing.T) {
	for _, netHTTP := range []bool{false, true} {
		t.Run(map[bool]string{false: "raw", true: "net/http"}[netHTTP], func(t *testing.T) { testRunCountsAndKeys(t, netHTTP) })
	}
}

func testRunCountsAndKeys(t *testing.T, netHTTP bool) {
	var mu sync.Mutex
	keys := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		keys[string(b)]++
		n := len(keys)
		mu.Unlock()
		if r.Header.Get("X-Test") != "yes" || r.Method != "POST" {
			w.WriteHeader(400)
			return
		}
		if n%2 == 0 {
			w.WriteHeader(429)
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Options{
		URL: srv.URL, Body: `{"key":"u{key}","again":"{key}"}`, Keys: 10, Connections: 8, Requests: 500,
		Header: http.Header{"X-Test": {"yes"}}, NetHTTP: netHTTP,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 500 || res.Errors != 0 || res.Hist.Count() != 500 || res.Status[200]+res.Status[429] != 500 {
		t.Fatalf("result: %+v", res)
	}
	if len(keys) != 10 || keys[`{"key":"u3","again":"3"}`] == 0 {
		t.Fatalf("keys: %v", keys)
	}
	out := res.String()
	for _, want := range []string{"requests   500", "throughput", "p50", "p99", "status     200:"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestRunStopsOnDuration(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	start := time.Now()
	res, err := Run(context.Background(), Options{URL: srv.URL, Connections: 2, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests == 0 || time.Since(start) > 5*time.Second {
		t.Fatalf("%d requests in %s", res.Requests, time.Since(start))
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []Options{
		{URL: "ftp://x", Requests: 1},
		{URL: "http://127.0.0.1:1/"},
		{URL: "http://127.0.0.1:1/", Requests: 1, Connections: -1},
	} {
		if _, err := Run(context.Background(), o); err == nil || !strings.HasPrefix(err.Error(), "loadtest: ") {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// TestRawClientBodies checks the lean client against chunked, empty and
// closing responses.
func TestRawClientBodies(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("kind") {
		case "chunked":
			w.Write([]byte("part one "))
			w.(http.Flusher).Flush()
			w.Write([]byte("part two"))
		case "close":
			w.Header().Set("Connection", "close")
			w.Write([]byte("bye"))
		case "empty":
			w.WriteHeader(204)
		}
	}))
	defer srv.Close()
	for _, kind := range []string{"chunked", "close", "empty"} {
		res, err := Run(context.Background(), Options{URL: srv.URL + "/?kind=" + kind, Connections: 2, Requests: 50})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 50 || res.Errors != 0 {
			t.Errorf("%s: %d requests, %d errors", kind, res.Requests, res.Errors)
		}
	}
}
