package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/aiclient"
)

// gate sits in front of an upstream, counts the requests it forwards and
// closes Reached when the n-th arrives: tests act on that, never on a
// sleep.
type gate struct {
	URL     string
	Reached chan struct{}
	mu      sync.Mutex
	count   int
	n       int
}

func newGate(t *testing.T, upstream string, n int) *gate {
	t.Helper()
	target, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{Reached: make(chan struct{}), n: n}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ErrorLog = log.New(io.Discard, "", 0)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.count++
		if g.count == g.n {
			close(g.Reached)
		}
		g.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	g.URL = srv.URL
	return g
}

// Count returns how many requests the gate has forwarded.
func (g *gate) Count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.count
}

// writeInput writes n JSONL prompts with ids p0..p(n-1) and returns the path.
func writeInput(t *testing.T, dir, tag string, n int) string {
	t.Helper()
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"id":"p%d","prompt":"%s prompt number %d"}`+"\n", i, tag, i)
	}
	path := dir + "/input-" + tag + ".jsonl"
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// readOutput parses the output line by line, failing on any line that is
// not a whole record, and returns the records.
func readOutput(t *testing.T, path string) []Record {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		t.Fatalf("output does not end with a newline: %q", tail(data))
	}
	var recs []Record
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		var r Record
		if err := dec.Decode(&r); err != nil || r.ID == "" || (r.Status != StatusOK && r.Status != StatusFailed) {
			t.Fatalf("output line %d is not a record (%v): %s", n, err, sc.Bytes())
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return recs
}

func tail(b []byte) []byte { return b[max(0, len(b)-80):] }

// checkExactlyOnce asserts that ids p0..p(n-1) each have exactly one
// record, an ok one, and that there are no others.
func checkExactlyOnce(t *testing.T, recs []Record, n int) {
	t.Helper()
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.ID]++
		if r.Status != StatusOK {
			t.Errorf("id %s: status %s: %s", r.ID, r.Status, r.Error)
		}
	}
	var missing, dup []string
	for i := range n {
		id := fmt.Sprintf("p%d", i)
		switch seen[id] {
		case 0:
			missing = append(missing, id)
		case 1:
		default:
			dup = append(dup, id)
		}
		delete(seen, id)
	}
	if len(missing)+len(dup)+len(seen) > 0 {
		t.Fatalf("missing %v, duplicated %v, unexpected %v", missing, dup, seen)
	}
}

func testClient(t *testing.T, baseURL string, mod func(*aiclient.Options)) *aiclient.Client {
	t.Helper()
	opts := aiclient.Options{
		BaseURL: strings.TrimRight(baseURL, "/") + "/v1", APIKey: "sk-test",
		BaseDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond, AttemptTimeout: 300 * time.Millisecond,
		MaxRetries: 10,
	}
	if mod != nil {
		mod(&opts)
	}
	c, err := aiclient.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
