package envoyrls

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// TestOverBoundsUnknownDomain: a request beyond the structural bounds is
// answered OVER_LIMIT for a domain that does not exist too, without the
// per-descriptor working state: a 4 MiB message of empty descriptors (two
// million of them) made a gigabyte of it before.
func TestOverBoundsUnknownDomain(t *testing.T) {
	e := newEnv(t, memStore, "testdata/config", nil)
	for _, domain := range []string{"no-such-domain", "test-domain"} {
		resp, err := e.callRaw(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: make([]*ratelimitv3.RateLimitDescriptor, maxDescriptors+1)})
		if err != nil || resp.GetOverallCode() != over || len(resp.GetStatuses()) != maxDescriptors+1 || resp.GetStatuses()[maxDescriptors].GetCode() != over {
			t.Fatalf("%s: %d descriptors: %v, %d statuses, %v", domain, maxDescriptors+1, resp.GetOverallCode(), len(resp.GetStatuses()), err)
		}
		if resp, err := e.callRaw(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key2", "x"), manyEntries(maxEntries + 1)}}); err != nil || resp.GetOverallCode() != over {
			t.Fatalf("%s: %d entries: %v, %v", domain, maxEntries+1, resp.GetOverallCode(), err)
		}
	}
	if n := testutil.ToFloat64(e.svc.metrics.requestErrors.WithLabelValues(unknownDomain, "over_bounds")); n != 2 {
		t.Errorf("over_bounds errors of unknown domains %v, want 2", n)
	}
	// Within the bounds, an unknown domain is OK as ever.
	if resp, err := e.callRaw(&rlsv3.RateLimitRequest{Domain: "no-such-domain", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key3", "victim")}}); err != nil || resp.GetOverallCode() != ok {
		t.Fatalf("unknown domain: %v, %v", resp.GetOverallCode(), err)
	}

	// What the service allocates for 100,000 descriptors, the decoding
	// aside: their statuses' pointers, not 256 bytes of state each.
	svc, err := New(Options{Store: newFuzzStore(t), ConfigDir: "testdata/config", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	const n = 100_000
	req := &rlsv3.RateLimitRequest{Domain: "no-such-domain", Descriptors: make([]*ratelimitv3.RateLimitDescriptor, n)}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, err := svc.ShouldRateLimit(context.Background(), req)
	runtime.ReadMemStats(&after)
	if err != nil || resp.GetOverallCode() != over || len(resp.GetStatuses()) != n {
		t.Fatalf("%d descriptors: %v, %d statuses, %v", n, resp.GetOverallCode(), len(resp.GetStatuses()), err)
	}
	got := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d descriptors of an unknown domain took %d KB to answer", n, got>>10)
	if got > 4<<20 {
		t.Errorf("%d descriptors of an unknown domain took %d MB to answer, want at most 4", n, got>>20)
	}
}

// TestJSONCrossOriginRefused: a page on another site cannot spend a
// descriptor's limit through /json with a simple (unpreflighted) POST;
// Envoy, curl and other clients that are not browsers can.
func TestJSONCrossOriginRefused(t *testing.T) {
	e := newEnv(t, memStore, "testdata/config", nil)
	srv := httptest.NewServer(e.svc.JSONHandler())
	t.Cleanup(srv.Close)
	post := func(hdr ...string) int {
		t.Helper()
		req, err := http.NewRequest("POST", srv.URL+"/json", strings.NewReader(`{"domain":"test-domain","descriptors":[{"entries":[{"key":"key3","value":"victim"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for _, hdr := range [][]string{
		{"Content-Type", "text/plain", "Sec-Fetch-Site", "cross-site"},
		{"Content-Type", "text/plain", "Origin", "https://evil.example"},
	} {
		if st := post(hdr...); st != http.StatusForbidden {
			t.Errorf("%q: %d, want 403", hdr, st)
		}
	}
	// key3 allows one an hour: the first request that is not a
	// browser's cross-site one takes it.
	if st := post("Content-Type", "application/json"); st != http.StatusOK {
		t.Fatalf("first request that is not cross-site: %d, want 200 (the cross-site ones were charged?)", st)
	}
	if st := post(); st != http.StatusTooManyRequests {
		t.Fatalf("second: %d, want 429", st)
	}
}

// TestBoundedDecoding: a message of more descriptors, or of more entries
// in one, than the service takes is decoded within the bounds: gRPC's
// 4 MiB let a request hold two million of either, a quarter of a
// gigabyte decoded, before it could be answered OVER_LIMIT. It is still
// OVER_LIMIT, with one status per descriptor; a message within the bounds
// decodes as the standard decoder has it.
func TestBoundedDecoding(t *testing.T) {
	const n = 1 << 20
	var descs, entries []byte
	descs = protowire.AppendTag(descs, 1, protowire.BytesType)
	descs = protowire.AppendString(descs, "test-domain")
	entries = append([]byte(nil), descs...)
	for range n {
		descs = protowire.AppendTag(descs, 2, protowire.BytesType)
		descs = protowire.AppendBytes(descs, nil)
	}
	var one []byte
	for range n {
		one = protowire.AppendTag(one, 1, protowire.BytesType)
		one = protowire.AppendBytes(one, nil)
	}
	entries = protowire.AppendTag(entries, 2, protowire.BytesType)
	entries = protowire.AppendBytes(entries, one)
	svc, err := New(Options{Store: newFuzzStore(t), ConfigDir: "testdata/config", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		wire   []byte
		descs  int
		maxMem uint64
	}{
		{"a million descriptors", descs, n, 24 << 20}, // their pointers (8 MB) and the message's copy
		{"a million entries in one", entries, 1, 8 << 20},
	} {
		req := &rlsv3.RateLimitRequest{}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		err := newCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(c.wire)}, req)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: decoding took %d KB", c.name, got>>10)
		if got > c.maxMem {
			t.Errorf("%s: decoding took %d MB, want at most %d", c.name, got>>20, c.maxMem>>20)
		}
		if req.GetDomain() != "test-domain" || len(req.GetDescriptors()) != c.descs {
			t.Fatalf("%s: domain %q, %d descriptors, want %d", c.name, req.GetDomain(), len(req.GetDescriptors()), c.descs)
		}
		resp, err := svc.ShouldRateLimit(context.Background(), req)
		if err != nil || resp.GetOverallCode() != over || len(resp.GetStatuses()) != c.descs {
			t.Fatalf("%s: %v, %d statuses, %v", c.name, resp.GetOverallCode(), len(resp.GetStatuses()), err)
		}
	}
	// Within the bounds, and past smallMessage: as the standard decoder.
	in := &rlsv3.RateLimitRequest{Domain: "test-domain", HitsAddend: 3}
	for i := range maxDescriptors {
		in.Descriptors = append(in.Descriptors, withHits(desc("key2", fmt.Sprint(i), "k", "v"), uint64(i)))
	}
	in.Descriptors[1] = manyEntries(maxEntries)
	in.Descriptors[2] = withOverride(desc("key3", "x"), 7, typev3.RateLimitUnit_MINUTE, 2)
	wire, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	got := &rlsv3.RateLimitRequest{}
	if err := newCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, got); err != nil || !proto.Equal(got, in) {
		t.Fatalf("a request within the bounds decoded as %v, %v", got, err)
	}
}

// TestJSONBounded: /json refuses a body of more objects than a request
// within the bounds can hold before protojson decodes it (a megabyte of
// "{}," decoded to some 50 MB); a request at the bounds is decoded and
// answered, and braces inside strings are not objects.
func TestJSONBounded(t *testing.T) {
	e := newEnv(t, memStore, "testdata/config", nil)
	h := e.svc.JSONHandler()
	post := func(body string) (int, string) {
		r := httptest.NewRequest("POST", "/json", strings.NewReader(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	var before, after runtime.MemStats
	for _, body := range []string{
		`{"domain":"test-domain","descriptors":[` + strings.TrimSuffix(strings.Repeat("{},", 340_000), ",") + `]}`,
		`{"domain":"test-domain","descriptors":[{"entries":[` + strings.TrimSuffix(strings.Repeat("{},", 340_000), ",") + `]}]}`,
	} {
		runtime.GC()
		runtime.ReadMemStats(&before)
		code, msg := post(body)
		runtime.ReadMemStats(&after)
		if code != http.StatusBadRequest || !strings.Contains(msg, "JSON objects") {
			t.Fatalf("%d KB of objects: %d %.200s", len(body)>>10, code, msg)
		}
		got := after.TotalAlloc - before.TotalAlloc
		t.Logf("refusing %d KB of objects took %d KB", len(body)>>10, got>>10)
		if got > 16<<20 { // the body read, twice over; decoding it took 50 MB
			t.Errorf("refusing %d KB of objects took %d MB, want at most 16", len(body)>>10, got>>20)
		}
	}
	// At the bounds: 256 descriptors of 64 entries, each with an override.
	entry := `{"key":"k","value":"{v}"}`
	d := `{"entries":[` + strings.TrimSuffix(strings.Repeat(entry+",", maxEntries), ",") + `],"limit":{"requestsPerUnit":5,"unit":"MINUTE"}}`
	body := `{"domain":"test-domain","descriptors":[` + strings.TrimSuffix(strings.Repeat(d+",", maxDescriptors), ",") + `]}`
	if n := jsonObjects([]byte(body)); n != maxJSONObjects {
		t.Fatalf("a request at the bounds has %d objects, want %d", n, maxJSONObjects)
	}
	if code, msg := post(body); code != http.StatusOK && code != http.StatusTooManyRequests {
		t.Fatalf("a request at the bounds: %d %.200s", code, msg)
	}
	if n := jsonObjects([]byte(`{"a":"{\"{","b":{"c":"}{"}}`)); n != 2 {
		t.Errorf("objects of a text with braces in strings: %d, want 2", n)
	}
}
