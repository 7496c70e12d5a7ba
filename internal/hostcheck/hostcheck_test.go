package hostcheck

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAllows: the names a listener is known by pass, every other name
// (including ones that merely start or end like an allowed one) does not.
func TestAllows(t *testing.T) {
	p := &Policy{
		Listen:  []string{"sluice.listen.example:8080", ":9090"},
		Allowed: []string{"sluice.internal.example", "*.corp.example"},
		Own:     []string{"box.lan", "box"},
	}
	for _, c := range []struct {
		host string
		want bool
	}{
		{"127.0.0.1:8080", true},
		{"[::1]:8080", true},
		{"[::ffff:127.0.0.1]:8080", true},
		{"10.1.2.3", true},
		{"localhost:8080", true},
		{"LOCALHOST.:8080", true},
		{"console.localhost", true},
		{"sluice.listen.example", true},
		{"box", true},
		{"BOX.lan:8080", true},
		{"sluice.internal.example:8080", true},
		{"Sluice.Internal.Example", true},
		{"a.corp.example:8080", true},
		{"evil.example:8080", false},
		{"evil.example", false},
		{"EVIL.example.:8080", false},
		{"corp.example", false}, // *.corp.example is the subdomains
		{"evilcorp.example", false},
		{"127.0.0.1.evil.example", false},
		{"localhost.evil.example", false},
		{"sluice.internal.example.evil.example", false},
		{"box.evil.example", false},
		{"::1", false}, // malformed: IPv6 needs brackets
		{"[::1", false},
		{"", false},
	} {
		if got := p.Allows(c.host); got != c.want {
			t.Errorf("Allows(%q) = %v, want %v", c.host, got, c.want)
		}
	}
	if !(&Policy{Allowed: []string{"*"}}).Allows("anything.example") {
		t.Error(`"*" does not turn the check off`)
	}
	if (&Policy{}).Allows("evil.example") {
		t.Error("an empty policy allows evil.example")
	}
}

// TestFromBrowser: Origin, Referer and each Sec-Fetch-* header mark a
// browser's request; a curl's headers do not.
func TestFromBrowser(t *testing.T) {
	for _, c := range []struct {
		hdr  []string
		want bool
	}{
		{nil, false},
		{[]string{"Content-Type", "application/x-www-form-urlencoded", "User-Agent", "curl/8"}, false},
		{[]string{"Origin", "http://evil.example"}, true},
		{[]string{"Origin", "null"}, true},
		{[]string{"Referer", "http://evil.example/"}, true},
		{[]string{"Sec-Fetch-Site", "same-origin"}, true},
		{[]string{"Sec-Fetch-Mode", "cors"}, true},
		{[]string{"Sec-Fetch-Dest", "empty"}, true},
		{[]string{"Sec-Fetch-User", "?1"}, true},
	} {
		h := http.Header{}
		for i := 0; i < len(c.hdr); i += 2 {
			h.Set(c.hdr[i], c.hdr[i+1])
		}
		if got := FromBrowser(h); got != c.want {
			t.Errorf("FromBrowser(%v) = %v, want %v", c.hdr, got, c.want)
		}
	}
}

// TestNormalize: entries are lower-cased and stripped of a trailing dot;
// addresses are unmapped; anything with a port, a scheme or a path is
// refused with ErrEntry.
func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"Sluice.Example.":   "sluice.example",
		" *.Corp.Example ":  "*.corp.example",
		"*":                 "*",
		"[::1]":             "::1",
		"::ffff:10.0.0.1":   "10.0.0.1",
		"under_score.local": "under_score.local",
	} {
		got, err := Normalize(in)
		if err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "*.", "sluice.example:8080", "http://sluice.example", "sluice.example/ui", "a..b", strings.Repeat("a", 64) + ".example", "*.*.example"} {
		if got, err := Normalize(in); !errors.Is(err, ErrEntry) {
			t.Errorf("Normalize(%q) = %q, %v; want ErrEntry", in, got, err)
		}
	}
}

// TestGuard: a rebound page's request is refused before the handler runs,
// a legitimate one reaches it, an exempt path is never checked, and the
// policy is read at each request.
func TestGuard(t *testing.T) {
	allowed := []string{"sluice.example"}
	var reached int
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { reached++; _, _ = io.WriteString(w, "ok") })
	h := Guard(next, func() *Policy { return &Policy{Allowed: allowed} },
		func(r *http.Request) Check {
			switch r.URL.Path {
			case "/exempt":
				return Skip
			case "/v1/check":
				return IfBrowser
			}
			return Always
		},
		func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, Message(r.Host, "allowed_hosts"), http.StatusForbidden)
		})
	do := func(path, host string, hdr ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", path, nil)
		r.Host = host
		for i := 0; i < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	w := do("/v1/check", "evil.example", "Origin", "http://evil.example")
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "DNS rebinding") || !strings.Contains(w.Body.String(), `"evil.example"`) || reached != 0 {
		t.Fatalf("rebound page: %d %q, handler ran %d times", w.Code, w.Body, reached)
	}
	for _, c := range []struct{ path, host, origin string }{
		{"/v1/check", "sluice.example", "http://sluice.example"},
		{"/v1/check", "127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"/v1/check", "localhost:8080", "http://localhost:8080"},
		{"/exempt", "evil.example", "http://evil.example"},
	} {
		if w := do(c.path, c.host, "Origin", c.origin); w.Code != http.StatusOK {
			t.Errorf("%s Host %s: %d %q", c.path, c.host, w.Code, w.Body)
		}
	}
	if w := do("/v1/check", "evil.example"); w.Code != http.StatusOK {
		t.Errorf("no browser's marks: %d", w.Code)
	}
	// A read is checked with no browser's mark at all: Chromium sends none
	// on a same-origin GET over http from a no-referrer page.
	if w := do("/ui/api/overview", "evil.example"); w.Code != http.StatusForbidden || reached != 5 {
		t.Errorf("unmarked read with a foreign Host: %d, handler ran %d times", w.Code, reached)
	}
	if w := do("/ui/api/overview", "10.0.0.7:8080"); w.Code != http.StatusOK {
		t.Errorf("unmarked read by IP: %d", w.Code)
	}
	allowed = append(allowed, "evil.example")
	if w := do("/v1/check", "evil.example", "Sec-Fetch-Site", "same-origin"); w.Code != http.StatusOK {
		t.Errorf("after evil.example was allowed: %d", w.Code)
	}
}

// TestKubeNames: the names the chart's Service answers to in the
// cluster's DNS, and nothing for values that are not DNS labels.
func TestKubeNames(t *testing.T) {
	got := KubeNames("sluice", "prod", "")
	want := []string{"sluice", "sluice.prod", "sluice.prod.svc", "sluice.prod.svc.cluster.local"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("KubeNames = %v, want %v", got, want)
	}
	if got := KubeNames("Sluice", "prod", "corp.internal."); got[3] != "sluice.prod.svc.corp.internal" {
		t.Errorf("with a cluster domain: %v", got)
	}
	if got := KubeNames("sluice", "", ""); len(got) != 1 || got[0] != "sluice" {
		t.Errorf("no namespace: %v", got)
	}
	for _, svc := range []string{"", "a.b", "evil.example", strings.Repeat("a", 64)} {
		if got := KubeNames(svc, "prod", ""); got != nil {
			t.Errorf("KubeNames(%q) = %v, want none", svc, got)
		}
	}
	t.Setenv(EnvService, "sluice")
	t.Setenv(EnvNamespace, "prod")
	p := &Policy{Own: OwnHosts()}
	for _, h := range []string{"sluice:8080", "sluice.prod", "sluice.prod.svc:8080", "sluice.prod.svc.cluster.local"} {
		if !p.Allows(h) {
			t.Errorf("OwnHosts does not allow %q", h)
		}
	}
	if p.Allows("sluice.prod.svc.cluster.local.evil.example") {
		t.Error("a suffix of a Service name passes")
	}
}
