package guard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
)

// faulty is a real memstore with faults switched on and off by the test:
// down fails every call as a dead server would; hold makes calls on one
// key wait until released (a slow key), counting how many wait at once.
type faulty struct {
	*memstore.Store
	down     atomic.Bool
	holdKey  atomic.Pointer[string]
	release  chan struct{}
	inFlight atomic.Int64
	peak     atomic.Int64
	calls    atomic.Int64
	pings    atomic.Int64
}

func newFaulty(t *testing.T) *faulty {
	t.Helper()
	m, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &faulty{Store: m, release: make(chan struct{})}
}

var errDown = fmt.Errorf("dial tcp: connection refused: %w", sluice.ErrUnavailable)

func (f *faulty) enter(ctx context.Context, key string) error {
	f.calls.Add(1)
	if f.down.Load() {
		return errDown
	}
	if err := ctx.Err(); err != nil {
		return err // as a real client, which sends nothing for a caller gone
	}
	if k := f.holdKey.Load(); k != nil && *k == key {
		n := f.inFlight.Add(1)
		defer f.inFlight.Add(-1)
		for {
			p := f.peak.Load()
			if n <= p || f.peak.CompareAndSwap(p, n) {
				break
			}
		}
		select {
		case <-f.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (f *faulty) Apply(ctx context.Context, op sluice.Op, r sluice.Request) (sluice.Decision, error) {
	if err := f.enter(ctx, r.Key); err != nil {
		return sluice.Decision{}, err
	}
	return f.Store.Apply(ctx, op, r)
}

func (f *faulty) ApplyAll(ctx context.Context, op sluice.Op, rs []sluice.Request) ([]sluice.Decision, error) {
	if err := f.enter(ctx, rs[0].Key); err != nil {
		return nil, err
	}
	return f.Store.ApplyAll(ctx, op, rs)
}

func (f *faulty) Ping(ctx context.Context) error {
	f.pings.Add(1)
	if f.down.Load() {
		return errDown
	}
	return nil
}

func newGuard(t *testing.T, st sluice.Store, o Options) *Guard {
	t.Helper()
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	g, err := New(st, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func req(key string, rate int64) sluice.Request {
	return sluice.Request{Key: key, Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: rate, Period: time.Minute, Burst: rate}, Cost: 1}
}

// eventually polls cond until it holds, failing after 30s (generous: a
// loaded machine under -race; a passing run never waits this long).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	redistest.WaitUntil(t, what, 30*time.Second, cond)
}

// One slow call is answered by the policy; the circuit stays closed and
// other keys keep their exact answers.
func TestSlowCallIsNotADeadStore(t *testing.T) {
	f := newFaulty(t)
	g := newGuard(t, f, Options{Policy: FailClosed, Timeout: 20 * time.Millisecond})
	slow := "slow"
	f.holdKey.Store(&slow)
	for range 50 { // far more than MinFailures, all on one key
		d, err := g.Apply(context.Background(), sluice.OpAllow, req("slow", 10))
		if err != nil || !d.Degraded || d.Fallback != "fail_closed" || d.Allowed {
			t.Fatalf("slow call: %+v %v", d, err)
		}
	}
	if st := g.Stats(); st.Openings != 0 || st.Errors != 50 {
		t.Fatalf("one slow key opened the circuit: %+v", st)
	}
	for i := range 20 {
		d, err := g.Apply(context.Background(), sluice.OpAllow, req(fmt.Sprint("cold", i), 10))
		if err != nil || d.Degraded || !d.Allowed {
			t.Fatalf("cold key %d: %+v %v", i, d, err)
		}
	}
	if err := g.Ready(context.Background()); err != nil {
		t.Fatalf("ready: %v", err)
	}
}

// A store failing across keys opens the circuit: calls are answered at
// once without the store; the probe closes it, and Ready recovers, without
// traffic.
func TestFailingStoreOpensAndProbeRecovers(t *testing.T) {
	f := newFaulty(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	g := newGuard(t, f, Options{Policy: FailOpen, ProbeInterval: 10 * time.Millisecond, Logger: log})
	f.down.Store(true)
	for i := range DefaultMinFailures {
		if d, err := g.Apply(context.Background(), sluice.OpAllow, req(fmt.Sprint("k", i), 10)); err != nil || !d.Degraded || !d.Allowed || d.Fallback != "fail_open" {
			t.Fatalf("%+v %v", d, err)
		}
	}
	if st := g.Stats(); st.Openings != 1 || st.Open != 1 {
		t.Fatalf("circuit not open after %d failures on many keys: %+v", DefaultMinFailures, st)
	}
	calls := f.calls.Load()
	for i := range 1000 {
		if d, _ := g.Apply(context.Background(), sluice.OpAllow, req(fmt.Sprint("k", i), 10)); !d.Degraded {
			t.Fatal("open circuit asked the store")
		}
	}
	if n := f.calls.Load() - calls; n != 0 {
		t.Fatalf("open circuit made %d store calls", n)
	}
	eventually(t, "not ready while down", func() bool { return g.Ready(context.Background()) != nil })
	if err := g.Ready(context.Background()); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Ready: %v", err)
	}
	f.down.Store(false)
	eventually(t, "ready after the store returns, without traffic", func() bool { return g.Ready(context.Background()) == nil })
	if d, err := g.Apply(context.Background(), sluice.OpAllow, req("k0", 10)); err != nil || d.Degraded {
		t.Fatalf("after recovery: %+v %v", d, err)
	}
	if st := g.Stats(); st.Openings != 1 {
		t.Fatalf("probes counted as openings: %+v", st)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, "circuit open") || !strings.Contains(out, "circuit closed") || !strings.Contains(out, `node=""`) {
		t.Fatalf("logs:\n%s", out)
	}
	if n := strings.Count(out, "store call failed"); n != 1 {
		t.Fatalf("%d failure lines, want 1 (rate-limited):\n%s", n, out)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// The probe alone opens the circuit of a dead store, with no traffic.
func TestProbeOpensWithoutTraffic(t *testing.T) {
	f := newFaulty(t)
	g := newGuard(t, f, Options{ProbeInterval: 10 * time.Millisecond})
	f.down.Store(true)
	eventually(t, "circuit open", func() bool { return g.Stats().Open == 1 })
	if f.calls.Load() != 0 {
		t.Fatal("probe used Apply although the store has Ping")
	}
}

// 1,000 concurrent calls on one slow key: at most MaxInFlightPerKey reach
// the store, and other keys are answered exactly meanwhile. The deadline
// is far beyond the test (a hot key's calls stay queued until the test
// releases them, however slow the machine; a cold call that waited behind
// them would be degraded only at the deadline, and the test then fails).
func TestHotKeyQueuesInItsCallers(t *testing.T) {
	f := newFaulty(t)
	g := newGuard(t, f, Options{Policy: FailClosed, Timeout: time.Minute, MaxInFlightPerKey: 4})
	hot := "hot"
	f.holdKey.Store(&hot)
	var wg sync.WaitGroup
	for range 1000 {
		wg.Go(func() { _, _ = g.Apply(context.Background(), sluice.OpAllow, req("hot", 1e6)) })
	}
	eventually(t, "hot calls in the store", func() bool { return f.inFlight.Load() == 4 })
	for i := range 100 {
		d, err := g.Apply(context.Background(), sluice.OpAllow, req(fmt.Sprint("cold", i), 10))
		if err != nil || d.Degraded {
			t.Fatalf("cold key during the hot burst: %+v %v", d, err)
		}
	}
	close(f.release)
	wg.Wait()
	if p := f.peak.Load(); p > 4 {
		t.Fatalf("%d calls of one key in the store at once, cap 4", p)
	}
	if st := g.Stats(); st.Openings != 0 {
		t.Fatalf("hot key opened the circuit: %+v", st)
	}
}

// Under Local, a key exhausted in the store stays exhausted when the store
// goes away, and what Local admits is charged to the store before the
// circuit closes.
func TestLocalSeedsAndCharges(t *testing.T) {
	f := newFaulty(t)
	g := newGuard(t, f, Options{Instances: 2, ProbeInterval: 10 * time.Millisecond})
	ctx := context.Background()
	spent, fresh := req("spent", 100), req("fresh", 100)
	for range 100 {
		if d, err := g.Apply(ctx, sluice.OpAllow, spent); err != nil || !d.Allowed || d.Degraded {
			t.Fatalf("%+v %v", d, err)
		}
	}
	if d, _ := g.Apply(ctx, sluice.OpAllow, fresh); !d.Allowed {
		t.Fatal("fresh denied")
	}
	f.down.Store(true)
	eventually(t, "circuit open", func() bool { return g.Stats().Open == 1 })
	if d, err := g.Apply(ctx, sluice.OpAllow, spent); err != nil || d.Allowed || !d.Degraded || d.Fallback != "local" {
		t.Fatalf("exhausted key admitted locally: %+v %v", d, err)
	}
	admitted := 0
	for range 200 {
		if d, _ := g.Apply(ctx, sluice.OpAllow, fresh); d.Allowed {
			admitted++
		}
	}
	if admitted != 49 { // (100 − 1) ÷ 2 instances
		t.Fatalf("local admitted %d of fresh, want its share 49", admitted)
	}
	f.down.Store(false)
	eventually(t, "circuit closed", func() bool { return g.Stats().Open == 0 })
	d, err := f.Store.Apply(ctx, sluice.OpPeek, sluice.Request{Key: "fresh", Algorithm: sluice.GCRA, Limit: fresh.Limit})
	if err != nil || d.Remaining != 100-1-49 {
		t.Fatalf("store after settling: remaining %d, want 50 (%v)", d.Remaining, err)
	}
}

// Refund, charge and reset are never answered by a policy.
func TestSettlingOpsFailLoudly(t *testing.T) {
	f := newFaulty(t)
	g := newGuard(t, f, Options{Policy: FailOpen})
	f.down.Store(true)
	for _, op := range []sluice.Op{sluice.OpRefund, sluice.OpCharge, sluice.OpReset} {
		if _, err := g.Apply(context.Background(), op, req("k", 10)); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s while down: %v", op, err)
		}
	}
	if _, err := g.WithPolicy(ReturnError).Apply(context.Background(), sluice.OpAllow, req("k", 10)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("error policy: %v", err)
	}
	if st := g.Stats(); st.Degraded[ReturnError] != 1 || st.Degraded[FailOpen] != 0 {
		t.Fatalf("degraded per policy: %+v", st.Degraded)
	}
}

// Bad requests are the caller's fault: they never count against the store.
func TestBadRequestsAreNotFailures(t *testing.T) {
	f := newFaulty(t)
	g := newGuard(t, f, Options{})
	for _, r := range []sluice.Request{{}, {Key: "k", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: -1, Period: time.Second}, Cost: 1}, {Key: "k", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1), Cost: 5}} {
		if _, err := g.Apply(context.Background(), sluice.OpAllow, r); err == nil || errors.Is(err, ErrUnavailable) {
			t.Fatalf("%+v: %v", r, err)
		}
	}
	if st := g.Stats(); st.Errors != 0 || st.Calls != 0 {
		t.Fatalf("%+v", st)
	}
}

func TestParsePolicy(t *testing.T) {
	for p := Local; p <= ReturnError; p++ {
		if got, err := ParsePolicy(strings.ToUpper(strings.ReplaceAll(p.String(), "_", "-"))); err != nil || got != p {
			t.Fatalf("%s: %v %v", p, got, err)
		}
	}
	if _, err := ParsePolicy("open"); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

// members is a store that counts three instances sharing it.
type members struct{ *memstore.Store }

func (members) Heartbeat(context.Context, string, time.Duration) (int, error) { return 3, nil }
func (members) Leave(context.Context, string) error                           { return nil }

// wrapper wraps a store and forwards none of its optional interfaces,
// as lease.Store does.
type wrapper struct{ inner sluice.Store }

func (w wrapper) Apply(ctx context.Context, op sluice.Op, r sluice.Request) (sluice.Decision, error) {
	return w.inner.Apply(ctx, op, r)
}

func (w wrapper) ApplyAll(ctx context.Context, op sluice.Op, rs []sluice.Request) ([]sluice.Decision, error) {
	return w.inner.ApplyAll(ctx, op, rs)
}

func (w wrapper) Unwrap() sluice.Store { return w.inner }

// TestFindsInterfacesThroughUnwrap: the guard counts instances through a
// wrapper that only unwraps, so Local divides by the real fleet size.
func TestFindsInterfacesThroughUnwrap(t *testing.T) {
	m, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	g := newGuard(t, wrapper{wrapper{members{m}}}, Options{HeartbeatInterval: 10 * time.Millisecond})
	deadline := time.Now().Add(5 * time.Second)
	for g.Stats().Instances != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("instances %d through two wrappers, want 3", g.Stats().Instances)
		}
		runtime.Gosched()
	}
	if find[Membership](wrapper{m}) != nil {
		t.Fatal("found Membership on a store that has none")
	}
}

// beats is a store whose heartbeats count what the test says: each
// Heartbeat announces itself on entered, then answers the next count.
type beats struct {
	*memstore.Store
	entered chan struct{}
	next    chan int
}

func (b *beats) Heartbeat(ctx context.Context, _ string, _ time.Duration) (int, error) {
	select {
	case b.entered <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	select {
	case n := <-b.next:
		return n, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (b *beats) Leave(context.Context, string) error { return nil }

// newBeats is a beats around m whose first heartbeat (New's own) reads
// first; the test answers the later ones on b.next.
func newBeats(m *memstore.Store, first int) *beats {
	b := &beats{Store: m, entered: make(chan struct{}), next: make(chan int)}
	go func() {
		<-b.entered
		b.next <- first
	}()
	return b
}

// TestInstancesDropWhenConfirmed: after Redis was away longer than the
// heartbeat TTL every instance lapsed, and the first heartbeats back count
// only those that renewed so far (and after a Cluster failover, each
// instance's client finds the promoted replica at its own time); Local's
// share must not grow on such readings while the others may still answer
// by Local. A lower count is taken after lowerAfter heartbeats in a row
// read fewer (the most they read); a higher one at once.
func TestInstancesDropWhenConfirmed(t *testing.T) {
	m, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	b := newBeats(m, 3)
	// The heartbeat's deadline is twice Timeout: far beyond the test.
	g := newGuard(t, b, Options{Timeout: time.Minute, HeartbeatInterval: time.Millisecond})
	if n := g.Instances(); n != 3 {
		t.Fatalf("instances %d after the first heartbeat, want 3", n)
	}
	type step struct{ read, want int }
	steps := []step{
		{1, 3}, // back after an outage: the others have not renewed yet
		{2, 3},
		{3, 3}, // all back: the run of lower reads ends
	}
	for range lowerAfter - 1 { // one left, or cannot reach the store yet
		steps = append(steps, step{2, 3})
	}
	steps = append(steps,
		step{1, 2}, // lowerAfter in a row: the most they read
		step{4, 4}, // more at once
	)
	for range lowerAfter - 1 {
		steps = append(steps, step{1, 4})
	}
	steps = append(steps, step{1, 1})
	for i := range len(steps) + 1 {
		// The heartbeats run one at a time: once the next one is in, the
		// last one's count is taken.
		<-b.entered
		if i > 0 {
			if c := steps[i-1]; g.Instances() != c.want {
				t.Fatalf("step %d: instances %d after reading %d, want %d", i-1, g.Instances(), c.read, c.want)
			}
		}
		if i < len(steps) {
			b.next <- steps[i].read
		}
	}
}
