package overrides

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		p, s string
		want bool
	}{
		{"alice", "alice", true},
		{"alice", "alice2", false},
		{"*", "", true},
		{"*", "anything", true},
		{"*@example.com", "bob@example.com", true},
		{"*@example.com", "bob@example.org", false},
		{"*@example.com", "@example.com", true},
		{"tenant:*", "tenant:acme", true},
		{"tenant:*", "tenan", false},
		{"a*b*c", "abc", true},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxcyyb", false},
		{"a*bc*bc", "abcbc", true},
		{"a*bc*bc", "abc", false},
		{"*ab*ab*", "abab", true},
		{"*ab*ab*", "aba", false},
		{"ab*ba", "aba", false}, // prefix and suffix overlap
		{"**", "x", true},
	} {
		if got := Match(c.p, c.s); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.p, c.s, got, c.want)
		}
	}
}

// TestMatchAgreesWithRegexp checks Match against a regexp translation on
// random patterns and strings over a small alphabet, where overlaps are
// frequent.
func TestMatchAgreesWithRegexp(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	gen := func(alpha string, n int) string {
		b := make([]byte, r.IntN(n))
		for i := range b {
			b[i] = alpha[r.IntN(len(alpha))]
		}
		return string(b)
	}
	for range 20000 {
		p, s := gen("ab*", 8), gen("ab", 10)
		re := regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(p), `\*`, ".*") + "$")
		if got, want := Match(p, s), re.MatchString(s); got != want {
			t.Fatalf("Match(%q, %q) = %v, regexp says %v", p, s, got, want)
		}
	}
}

// TestMatchAdversarial: the worst pattern a caller may set against the
// longest identity stays linear: it must finish instantly, and it does
// with no backtracking (counted here by a bound on the work, not time).
func TestMatchAdversarial(t *testing.T) {
	p := "*" + strings.Repeat("a", 60) + "*" + strings.Repeat("a", 60) + "*" + strings.Repeat("a", 60) + "*b"
	if err := ValidatePattern(p); err != nil {
		t.Fatal(err)
	}
	s := strings.Repeat("a", 512)
	for range 1000 {
		if Match(p, s) {
			t.Fatal("matched")
		}
	}
	if err := ValidatePattern(strings.Repeat("*a", MaxStars+1)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("too many stars: %v", err)
	}
}

func TestValidate(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	exists := func(p string) bool { return p == "api" }
	for _, c := range []struct {
		name string
		o    Override
		ok   bool
	}{
		{"limit", Override{Identity: "alice", Policy: "api", Limit: "100/min"}, true},
		{"scale every policy", Override{Identity: "*@example.com", Scale: 5}, true},
		{"key name", Override{Identity: "key_name:acme-*", Scale: 2}, true},
		{"key hash", Override{Identity: "key:0d7308f7*", Scale: 2}, true},
		{"raw key refused", Override{Identity: "key:sk-live-secret", Scale: 2}, false},
		{"no identity", Override{Policy: "api", Limit: "1/s"}, false},
		{"limit without policy", Override{Identity: "a", Limit: "1/s"}, false},
		{"unknown policy", Override{Identity: "a", Policy: "nope", Limit: "1/s"}, false},
		{"both", Override{Identity: "a", Policy: "api", Limit: "1/s", Scale: 2}, false},
		{"neither", Override{Identity: "a", Policy: "api"}, false},
		{"huge limit", Override{Identity: "a", Policy: "api", Limit: "99999999999999999/s"}, false},
		{"negative scale", Override{Identity: "a", Scale: -1}, false},
		{"huge scale", Override{Identity: "a", Scale: 1e9}, false},
		{"long identity", Override{Identity: strings.Repeat("x", MaxIdentityLen+1), Scale: 2}, false},
		{"long wildcard", Override{Identity: strings.Repeat("x", MaxPatternLen) + "*", Scale: 2}, false},
		{"identity longer than a wildcard", Override{Identity: strings.Repeat("x", MaxIdentityLen), Scale: 2}, true},
		{"invalid utf8", Override{Identity: "a\xff", Scale: 2}, false},
		{"control in a wildcard", Override{Identity: "a\nb*", Scale: 2}, false},
		{"control in an identity", Override{Identity: "a\nb", Scale: 2}, true},
		{"past", Override{Identity: "a", Scale: 2, Until: time.Unix(0, now-1)}, false},
		{"far future", Override{Identity: "a", Scale: 2, Until: time.Unix(0, now).Add(2 * MaxDuration)}, false},
		{"pipe policy", Override{Identity: "a", Policy: "a|b", Limit: "1/s"}, false},
		{"long reason", Override{Identity: "a", Scale: 2, Reason: strings.Repeat("r", MaxReasonLen+1)}, false},
	} {
		err := c.o.Validate(now, exists)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// TestPrecedence: specific beats wildcard, a more literal wildcard beats a
// looser one, a policy's override beats an every-policy one of the same
// pattern, expired ones are skipped.
func TestPrecedence(t *testing.T) {
	now := int64(1e18)
	list := []Override{
		{Identity: "*", Scale: 2},
		{Identity: "*@example.com", Policy: "api", Limit: "20/s"},
		{Identity: "*@example.com", Scale: 3},
		{Identity: "bob@example.com", Policy: "api", Limit: "50/s"},
		{Identity: "carol@example.com", Policy: "api", Limit: "60/s", Until: time.Unix(0, now)},
		{Identity: "key_name:acme-*", Scale: 7},
		{Identity: "key_name:acme-prod", Policy: "api", Limit: "70/s"},
	}
	for i := range list {
		if err := list[i].compile(); err != nil {
			t.Fatal(err)
		}
	}
	s := NewSet(list)
	base := sluice.Limit{Rate: 10, Period: time.Second}
	for _, c := range []struct {
		identity, keyName, policy string
		want                      int64
	}{
		{"bob@example.com", "", "api", 50},       // exact beats wildcard
		{"dave@example.com", "", "api", 20},      // wildcard for the policy
		{"dave@example.com", "", "other", 30},    // wildcard for every policy
		{"carol@example.com", "", "api", 20},     // exact expired: the wildcard
		{"eve", "", "api", 20},                   // "*"
		{"key:abc", "acme-prod", "api", 70},      // exact key name
		{"key:abc", "acme-dev", "api", 70},       // key-name wildcard beats "*"
		{"key:abc", "other", "api", 20},          // "*"
		{"alice@example.com", "acme-x", "x", 30}, // the more literal wildcard
	} {
		o := s.Lookup(c.identity, c.keyName, c.policy, now)
		if o == nil {
			t.Errorf("%s/%s/%s: no override", c.identity, c.keyName, c.policy)
			continue
		}
		if got := o.Apply(base).Rate; got != c.want {
			t.Errorf("%s/%s/%s: rate %d (%s), want %d", c.identity, c.keyName, c.policy, got, o.Identity, c.want)
		}
	}
	if (*Set)(nil).Lookup("a", "", "p", now) != nil {
		t.Error("nil set")
	}
}

func TestManagerMemory(t *testing.T) {
	var logs bytes.Buffer
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	m, err := New(Options{Backend: NewMemory(), Clock: clk, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := sluice.Limit{Rate: 10, Period: time.Minute}
	if l, ok := m.Apply("acme", "", "api", base); ok || l != base {
		t.Fatal("override before any")
	}
	if _, _, err := m.Put(ctx, "admin_token", Override{Identity: "acme", Scale: 5, Reason: "launch"}, time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	if l, ok := m.Apply("acme", "", "api", base); !ok || l.Rate != 50 {
		t.Fatalf("5x: %v %v", l, ok)
	}
	before, _, err := m.Put(ctx, "admin_token", Override{Identity: "acme", Scale: 2}, 0, nil)
	if err != nil || before == nil || before.Scale != 5 {
		t.Fatalf("replace: %v %v", before, err)
	}
	clk.Advance(2 * time.Hour) // the second has no expiry
	if l, _ := m.Apply("acme", "", "api", base); l.Rate != 20 {
		t.Fatalf("2x: %v", l)
	}
	if _, _, err := m.Put(ctx, "admin_token", Override{Identity: "short", Scale: 3}, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	if _, ok := m.Apply("short", "", "api", base); ok {
		t.Fatal("expired override applies")
	}
	if _, err := m.Delete(ctx, "admin_token", "acme", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Delete(ctx, "admin_token", "acme", ""); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	for _, want := range []string{`"audit":true`, `"by":"admin_token"`, `"before":"scale 5x until 2030-01-01T01:00:00Z"`, `"after":"scale 2x"`, `"action":"delete"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("audit log lacks %s:\n%s", want, logs.String())
		}
	}
}

func TestBounds(t *testing.T) {
	m, _ := New(Options{Backend: NewMemory(), Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	for i := range MaxWildcards {
		if _, _, err := m.Put(ctx, "t", Override{Identity: "w" + strings.Repeat("x", i%200) + "*" + string(rune('a'+i/200)), Scale: 2}, 0, nil); err != nil {
			t.Fatal(i, err)
		}
	}
	if _, _, err := m.Put(ctx, "t", Override{Identity: "one-more-*", Scale: 2}, 0, nil); !errors.Is(err, ErrFull) {
		t.Fatalf("wildcard %d: %v", MaxWildcards+1, err)
	}
	if _, _, err := m.Put(ctx, "t", Override{Identity: "exact", Scale: 2}, 0, nil); err != nil {
		t.Fatalf("exact still fits: %v", err)
	}
}

// TestRedisShared: two managers on one Redis; a change on one applies on
// the other by its poll (waited for with a deadline), deletes too.
func TestRedisShared(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { testRedisShared(t, []string{redistest.Standalone(t).Addr}) })
	// The hash and the version share a hash tag: one slot, one script.
	t.Run("cluster", func(t *testing.T) { testRedisShared(t, redistest.SharedCluster(t).Addrs()) })
}

func testRedisShared(t *testing.T, addrs []string) {
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	prefix := redistest.Prefix(t) + ":{ovr}"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ms [2]*Manager
	for i := range ms {
		ms[i], _ = New(Options{Backend: NewRedis(func() rueidis.Client { return cl }, prefix), PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		go ms[i].Run(ctx)
	}
	base := sluice.Limit{Rate: 10, Period: time.Second}
	if _, _, err := ms[0].Put(ctx, "t", Override{Identity: "tenant:*", Policy: "api", Limit: "99/s"}, 0, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { l, _ := ms[1].Apply("tenant:acme", "", "api", base); return l.Rate == 99 })
	if _, err := ms[1].Delete(ctx, "t", "tenant:*", "api"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := ms[0].Apply("tenant:acme", "", "api", base); return !ok })
	if _, err := ms[0].Delete(ctx, "t", "tenant:*", "api"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete again: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	if !redistest.PollUntil(time.Now().Add(2*time.Second), cond) {
		t.Fatal("condition not met within 2s")
	}
}

// TestRedisDown: while Redis is down a manager keeps applying the
// overrides it last read, and a change fails with ErrUnavailable (the
// API's 503); when Redis returns, changes flow again.
func TestRedisDown(t *testing.T) {
	srv := redistest.NewStandalone(t)
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ms [2]*Manager
	for i := range ms {
		ms[i], _ = New(Options{Backend: NewRedis(func() rueidis.Client { return cl }, ""), PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		go ms[i].Run(ctx)
	}
	base := sluice.Limit{Rate: 10, Period: time.Second}
	if _, _, err := ms[0].Put(ctx, "t", Override{Identity: "acme", Scale: 3}, 0, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { l, _ := ms[1].Apply("acme", "", "api", base); return l.Rate == 30 })
	srv.Kill()
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	if _, _, err := ms[0].Put(short, "t", Override{Identity: "other", Scale: 2}, 0, nil); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("put with Redis down: %v", err)
	}
	if l, _ := ms[1].Apply("acme", "", "api", base); l.Rate != 30 {
		t.Fatalf("the last overrides are not kept: %v", l)
	}
	srv.Restart(t)
	// The restarted server has lost its data (no persistence): a new change
	// is applied everywhere, and the old one is gone with it.
	waitFor(t, func() bool {
		_, _, err := ms[0].Put(ctx, "t", Override{Identity: "other", Scale: 2}, 0, nil)
		return err == nil
	})
	waitFor(t, func() bool { l, _ := ms[1].Apply("other", "", "api", base); return l.Rate == 20 })
}

// BenchmarkLookup is the per-decision cost of the overrides: "exact" is a
// hit on an exact pattern (a map lookup, the baseline); "wildcards-miss"
// is the worst case a caller can meet, MaxWildcards patterns of
// MaxStars stars each tried and none matching, for the identity and its
// key name.
func BenchmarkLookup(b *testing.B) {
	var list []Override
	for i := range MaxWildcards / 2 {
		n := strings.Repeat("x", i%50) + string(rune('a'+i/50))
		list = append(list,
			Override{Identity: "*" + n + "*tenant*" + n + "*", Scale: 2},
			Override{Identity: KeyNamePrefix + "*" + n + "*acme*" + n + "*", Scale: 2})
	}
	list = append(list, Override{Identity: "tenant:exact", Scale: 3})
	for i := range list {
		if err := list[i].compile(); err != nil {
			b.Fatal(err)
		}
	}
	s := NewSet(list)
	now := int64(1e18)
	for _, c := range []struct{ name, identity, keyName string }{
		{"exact", "tenant:exact", ""},
		{"wildcards-miss", "tenant:" + strings.Repeat("y", 64), "acme-prod"},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if o := s.Lookup(c.identity, c.keyName, "api", now); (o != nil) != (c.name == "exact") {
					b.Fatal("wrong lookup", o)
				}
			}
		})
	}
}

// TestRedisWildcardBoundFleet: the wildcard bound is counted in Redis, not
// in a replica's snapshot: a replica that has not yet read the others'
// wildcards (its snapshot empty) cannot add one past MaxWildcards.
func TestRedisWildcardBoundFleet(t *testing.T) {
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{redistest.Standalone(t).Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	prefix := redistest.Prefix(t) + ":{ovr}"
	b := NewRedis(func() rueidis.Client { return cl }, prefix)
	for i := range MaxWildcards {
		if _, err := b.Put(ctx, Override{Identity: fmt.Sprintf("w%d-*", i), Scale: 2}); err != nil {
			t.Fatal(i, err)
		}
	}
	stale, _ := New(Options{Backend: b, Logger: slog.New(slog.DiscardHandler)})
	if _, _, err := stale.Put(ctx, "t", Override{Identity: "one-more-*", Scale: 2}, 0, nil); !errors.Is(err, ErrFull) {
		t.Fatalf("wildcard %d from a stale replica: %v", MaxWildcards+1, err)
	}
	for _, o := range []Override{
		{Identity: "w0-*", Scale: 3}, // replacing one is no new one
		{Identity: "a|b", Scale: 2},  // exact, with the separator of IDs in it
		{Identity: "exact", Policy: "p", Limit: "1/s"},
	} {
		if _, _, err := stale.Put(ctx, "t", o, 0, nil); err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
	}
}
