package redisstore

// Deployments other than plain standalone and Cluster, each against real
// redis-server processes from internal/redistest: Sentinel (with a
// failover), TLS, and ACL credentials.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
)

// deployLimit admits 5 a minute, so a handful of calls at one fake instant
// walk Remaining down 4, 3, 2, 1, 0 and then deny with an exact RetryAfter.
var deployLimit = sluice.Limit{Rate: 5, Period: time.Minute}

// checker applies the same calls to a Redis store and to a memstore on the
// same fake clock, the reference, and fails on any difference.
type checker struct {
	t   *testing.T
	clk *clock.Fake
	ref *memstore.Store
	key string
}

func newChecker(t *testing.T) *checker {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	ref, err := memstore.New(memstore.Options{Clock: clk, MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ref.Close() })
	return &checker{t: t, clk: clk, ref: ref, key: redistest.Prefix(t) + "k"}
}

func (c *checker) req() sluice.Request {
	return sluice.Request{Key: c.key, Algorithm: sluice.GCRA, Limit: deployLimit, Cost: 1}
}

// allow makes one Allow call on s and checks it against the reference and
// against wantRemaining (-1: a denial).
func (c *checker) allow(s *Store, wantRemaining int64) {
	c.t.Helper()
	got, err := s.Apply(context.Background(), sluice.OpAllow, c.req())
	if err != nil {
		c.t.Fatalf("Allow: %v", err)
	}
	want, err := c.ref.Apply(context.Background(), sluice.OpAllow, c.req())
	if err != nil {
		c.t.Fatal(err)
	}
	c.compare(got, want, wantRemaining)
}

func (c *checker) compare(got, want sluice.Decision, wantRemaining int64) {
	c.t.Helper()
	if got != want {
		c.t.Fatalf("decision %+v, reference %+v", got, want)
	}
	if wantRemaining >= 0 && (!got.Allowed || got.Remaining != wantRemaining) {
		c.t.Fatalf("decision %+v, want allowed with Remaining %d", got, wantRemaining)
	}
	if wantRemaining < 0 && (got.Allowed || got.RetryAfter != 12*time.Second) {
		c.t.Fatalf("decision %+v, want denied with RetryAfter 12s", got)
	}
}

// A redis+sentinel:// URL naming two sentinels reaches the master they
// monitor, and decisions are exact.
func TestSentinelDecisions(t *testing.T) {
	master := redistest.NewStandalone(t)
	sen := redistest.NewSentinels(t, master, 2)
	c := newChecker(t)
	s := newStore(t, Options{URL: sen.URL(), Clock: c.clk, DisableDenyCache: true})
	before := scriptCalls(t, master)
	for _, rem := range []int64{4, 3, 2, 1, 0, -1} {
		c.allow(s, rem)
	}
	if n := scriptCalls(t, master) - before; n < 6 {
		t.Fatalf("the master ran %d scripts for 6 calls", n)
	}
}

// The master dies, a sentinel promotes its replica, and the store follows:
// calls fail for a bounded time, then succeed on the new master with the
// state the replica received.
func TestSentinelFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	master := redistest.NewStandalone(t)
	replica := redistest.NewReplica(t, master)
	sen := redistest.NewSentinels(t, master, 2)
	if err := sen.WaitReplicas(ctx, 1); err != nil {
		t.Fatal(err)
	}
	c := newChecker(t)
	s := newStore(t, Options{URL: sen.URL(), Clock: c.clk, DisableDenyCache: true,
		Timeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	for _, rem := range []int64{4, 3} {
		c.allow(s, rem)
	}
	// The replica must hold the key before the master dies.
	if err := redistest.WaitReplicated(ctx, master, replica); err != nil {
		t.Fatal(err)
	}
	if n, err := replica.Do(ctx, "EXISTS", c.key); err != nil || n != int64(1) {
		t.Fatalf("EXISTS on the replica = %v, %v", n, err)
	}
	start := time.Now()
	master.Kill()
	if err := sen.Failover(ctx); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	want, err := c.ref.Apply(ctx, sluice.OpAllow, c.req())
	if err != nil {
		t.Fatal(err)
	}
	failures := 0
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := s.Apply(ctx, sluice.OpAllow, c.req())
		if err == nil {
			c.compare(got, want, 2)
			break
		}
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("error during failover: %v", err)
		}
		failures++
		select {
		case <-ctx.Done():
			t.Fatalf("store not recovered %v after the kill (%d failed calls): %v", time.Since(start), failures, err)
		case <-tick.C:
		}
	}
	t.Logf("recovered %v after the kill, %d failed calls", time.Since(start), failures)
	c.allow(s, 1)
	if err := sen.WaitMaster(ctx, replica.Addr); err != nil {
		t.Fatal(err)
	}
	if n := scriptCalls(t, replica); n < 2 {
		t.Fatalf("the promoted replica ran %d scripts", n)
	}
}

// rediss:// with ca_file trusts the test CA and decides exactly; without
// it, the system roots do not trust the server and New fails clearly.
func TestTLS(t *testing.T) {
	srv := redistest.NewTLSStandalone(t)
	c := newChecker(t)
	s := newStore(t, Options{URL: srv.URL() + "?ca_file=" + url.QueryEscape(srv.CAFile), Clock: c.clk, DisableDenyCache: true})
	for _, rem := range []int64{4, 3, 2, 1, 0, -1} {
		c.allow(s, rem)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A handshake slower than the dial timeout (a loaded machine) leaves
	// the store to connect later; retry until the handshake completes.
	var err error
	for range 5 {
		var st *Store
		st, err = New(ctx, Options{URL: srv.URL(), Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			break
		}
		st.Close()
	}
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("New without the CA: %v; want ErrUnavailable naming the unknown authority", err)
	}
	t.Logf("untrusted: %v", err)
	// Plain TCP to the TLS port looks like an unreachable server: New may
	// leave it to a later connection, but no call succeeds.
	plain, err := New(ctx, Options{URL: "redis://" + srv.Addr, Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		defer plain.Close()
		_, err = plain.Apply(ctx, sluice.OpAllow, c.req())
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("plain TCP to the TLS port: %v; want ErrUnavailable", err)
	}

	for _, bad := range []string{
		"redis://" + srv.Addr + "?ca_file=" + url.QueryEscape(srv.CAFile), // ca_file without TLS
		srv.URL() + "?ca_file=/nonexistent/ca.pem",
		srv.URL() + "?ca_file=" + url.QueryEscape(t.TempDir()),
	} {
		if _, err := New(ctx, Options{URL: bad}); !errors.Is(err, ErrBadURL) {
			t.Errorf("New(%q) = %v; want ErrBadURL", bad, err)
		}
	}
}

// An ACL user authenticates from the URL or from Options; a wrong password
// fails New with Redis's WRONGPASS, and no error carries a password.
func TestACLCredentials(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	user := fmt.Sprintf("sluice-test-%06x", rand.Uint32()&0xffffff)
	password := fmt.Sprintf("p@ss%%w/rd-%08x", rand.Uint32())
	if err := srv.AddUser(ctx, user, password); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = srv.Do(context.Background(), "ACL", "DELUSER", user) })
	withCreds := func(pass string) string {
		return "redis://" + url.UserPassword(user, pass).String() + "@" + srv.Addr
	}

	c := newChecker(t)
	s := newStore(t, Options{URL: withCreds(password), Clock: c.clk, DisableDenyCache: true})
	c.allow(s, 4)
	s2 := newStore(t, Options{URL: srv.URL(), Username: user, Password: password, Clock: c.clk, DisableDenyCache: true})
	c.allow(s2, 3)
	who, err := s2.Client().Do(ctx, s2.Client().B().AclWhoami().Build()).ToString()
	if err != nil || who != user {
		t.Fatalf("ACL WHOAMI = %q, %v; want %q", who, err, user)
	}

	wrong := fmt.Sprintf("wr0ng-%08x", rand.Uint32())
	for name, opts := range map[string]Options{
		"url":     {URL: withCreds(wrong)},
		"options": {URL: srv.URL(), Username: user, Password: wrong},
	} {
		opts.Timeout = 5 * time.Second
		_, err := New(ctx, opts)
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Fatalf("%s: New with a wrong password: %v; want ErrUnavailable with WRONGPASS", name, err)
		}
		for _, secret := range []string{wrong, password, url.QueryEscape(wrong), url.QueryEscape(password), url.PathEscape(password)} {
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("%s: error contains a password: %v", name, err)
			}
		}
		t.Logf("%s: %v", name, err)
	}
}
