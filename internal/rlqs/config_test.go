package rlqs

import (
	"crypto/sha256"
	"errors"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/yamlconf"
	"github.com/sluice-io/sluice/memstore"
)

// TestConfigErrors: every problem of a bad section is reported with its
// file and line, as the rest of sluice's config is.
func TestConfigErrors(t *testing.T) {
	data, err := os.ReadFile("testdata/bad.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	doc, err := yamlconf.Decode(ErrConfig, "testdata/bad.yaml", data, &c)
	if err != nil {
		t.Fatal(err)
	}
	c.Check(doc)
	err = doc.Err()
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err = %v, want ErrConfig", err)
	}
	msg := err.Error()
	for _, want := range []string{
		"testdata/bad.yaml:1: report_interval: 100ms: must be more than 100ms (Envoy refuses a reporting_interval of 100ms or less)",
		"testdata/bad.yaml:2: assignment_ttl: 1h0m0s: must be whole seconds (Envoy reads only the seconds) within [report_interval, 10 × report_interval]",
		"testdata/bad.yaml:3: max_streams_per_peer: -1",
		"testdata/bad.yaml:10: domains[0].policies[0].unit: \"fortnight\": must be second, minute, hour or day",
		"testdata/bad.yaml:11: domains[0].policies[1].name: duplicate policy name \"a\"",
		"testdata/bad.yaml:12: domains[0].policies[1].match: key \"user\" has an empty value",
		"testdata/bad.yaml:17: domains[0].policies[2].denied: a denied policy takes no requests_per_unit, unit or algorithm",
		"testdata/bad.yaml:20: domains[0].policies[3].match: at least one bucket id key is required",
		"testdata/bad.yaml:28: domains[1].domain: duplicate domain \"envoy\"",
		// A global policy without serve's regions.
		"testdata/bad.yaml:27: domains[0].policies[4].scope: global needs serve's store.region and store.regions",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
}

// TestConfigGlobal: a global policy's home is one of serve's regions (as
// an RLS rule's is), a regional one has none, and a denied one is
// regional.
func TestConfigGlobal(t *testing.T) {
	base := func(p Policy) *Config {
		return &Config{Regions: []string{"eu", "us", "ap"}, Domains: []Domain{{Domain: "d", Policies: []Policy{p}}}}
	}
	lim := Policy{Name: "p", Match: map[string]string{"route": "*"}, RequestsPerUnit: 100, Unit: "second"}
	for _, tc := range []struct {
		scope, home string
		denied      bool
		want        string // "" valid
	}{
		{"global", "eu", false, ""},
		{"global", "", false, ""},
		{"GLOBAL", "ap", false, ""},
		{"global", "mars", false, `policies[0].home: unknown region "mars"; valid: eu, us, ap`},
		{"", "eu", false, "policies[0].home: only a policy with scope: global has a home"},
		{"planet", "", false, `policies[0].scope: unknown scope "planet"; valid: regional, global`},
		{"global", "", true, "policies[0].scope: a denied policy has no limit to hold across regions"},
	} {
		p := lim
		p.Scope, p.Home = tc.scope, tc.home
		if tc.denied {
			p.RequestsPerUnit, p.Unit = 0, ""
			p.Denied = true
		}
		err := base(p).Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("scope %q home %q: %v", tc.scope, tc.home, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("scope %q home %q: %v, want %q", tc.scope, tc.home, err, tc.want)
		}
	}
	c := base(Policy{Name: "p", Match: map[string]string{"route": "*"}, RequestsPerUnit: 100, Unit: "second", Scope: "global", Home: "us"})
	ds, err := c.compileAll()
	if err != nil {
		t.Fatal(err)
	}
	if p := ds["d"].policies[0]; !p.global || p.home != "us" {
		t.Errorf("compiled: global %v home %q", p.global, p.home)
	}
	// A server that cannot reach the other regions refuses it.
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if _, err := New(Options{Store: st, Config: c}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "Options.Global") {
		t.Errorf("New with a global policy and no Options.Global: %v", err)
	}
}

func TestConfigLookup(t *testing.T) {
	c := &Config{Domains: []Domain{{Domain: "d", Policies: []Policy{
		{Name: "admin", Match: map[string]string{"route": "admin"}, Denied: true},
		{Name: "user", Match: map[string]string{"route": "*", "user": "*"}, RequestsPerUnit: 5, Unit: "second"},
		{Name: "route", Match: map[string]string{"route": "*"}, RequestsPerUnit: 50, Unit: "minute"},
	}}}}
	ds, err := c.compileAll()
	if err != nil {
		t.Fatal(err)
	}
	d := ds["d"]
	for _, tc := range []struct {
		id   map[string]string
		want string
	}{
		{map[string]string{"route": "admin", "user": "u"}, "admin"},
		{map[string]string{"route": "api", "user": "u"}, "user"},
		{map[string]string{"route": "api"}, "route"},
		{map[string]string{"path": "/"}, ""},
	} {
		got := ""
		if p := d.lookup(tc.id); p != nil {
			got = p.name
		}
		if got != tc.want {
			t.Errorf("lookup(%v) = %q, want %q", tc.id, got, tc.want)
		}
	}
	if canonical(map[string]string{"a": "b:c"}) == canonical(map[string]string{"a:b": "c"}) {
		t.Error("canonical ids collide")
	}
	// The store keys of running instances (a rolling upgrade shares
	// Redis) are the hash of the form fmt built before: it must not move.
	id := map[string]string{"route": "api", "user": "ü-42", "a": ""}
	if got, want := canonical(id), "1:a0:5:route3:api4:user5:ü-42"; got != want {
		t.Errorf("canonical = %q, want %q", got, want)
	}
	if h := sha256.Sum256([]byte(canonical(id))); hashID(id) != [16]byte(h[:16]) {
		t.Error("hashID is not the hash of canonical")
	}
}

// TestMaxStreamsFor: the server's default stream bound follows the Go
// runtime's memory limit (the shipped 256 MiB pod's soft limit of 230 MiB
// gives 76, TestAbuseMemory's flood fitting it), never under 16 nor over
// DefaultMaxStreams (no limit).
func TestMaxStreamsFor(t *testing.T) {
	for _, c := range []struct {
		limit int64
		want  int
	}{{256 << 20 * 9 / 10, 76}, {512 << 20 * 9 / 10, 153}, {1 << 62, DefaultMaxStreams}, {math.MaxInt64, DefaultMaxStreams}, {1 << 20, 16}} {
		if got := MaxStreamsFor(c.limit); got != c.want {
			t.Errorf("MaxStreamsFor(%d MiB) = %d, want %d", c.limit>>20, got, c.want)
		}
	}
}

// TestMaxStreamsDefaultFollowsMemoryLimit: a server whose config leaves
// max_streams unset bounds its streams by MaxStreamsFor the Go runtime's
// memory limit at the time (sluice serve sets it from the cgroup), and a
// configured max_streams wins over it.
func TestMaxStreamsDefaultFollowsMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(48 << 20)
	defer debug.SetMemoryLimit(old)
	if got, want := newPeerTable(clock.NewFake(time.Unix(0, 0)), &Config{}).maxStreams, MaxStreamsFor(48<<20); got != want || want != 16 {
		t.Errorf("max_streams unset under a 48 MiB limit: %d, want %d (16)", got, want)
	}
	if got := newPeerTable(clock.NewFake(time.Unix(0, 0)), &Config{MaxStreams: 300}).maxStreams; got != 300 {
		t.Errorf("max_streams: 300 configured: %d", got)
	}
	debug.SetMemoryLimit(math.MaxInt64)
	if got := newPeerTable(clock.NewFake(time.Unix(0, 0)), &Config{}).maxStreams; got != DefaultMaxStreams {
		t.Errorf("max_streams unset, no memory limit: %d, want %d", got, DefaultMaxStreams)
	}
}
