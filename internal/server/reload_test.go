package server

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
)

// syncBuffer is a bytes.Buffer safe for the service's concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestReloadWholeOrNothing: a file that changes a restart-only setting is
// rejected whole (its other changes are not applied either), and --listen
// is applied to each reloaded file before it is compared, so a reload with
// the flag set neither warns nor fails about the listen address.
func TestReloadWholeOrNothing(t *testing.T) {
	logs := &syncBuffer{}
	s := startService(t, svcOptions{log: logs})
	raised := strings.Replace(testConfig, "a: {limit: 5/s}", "a: {limit: 6/s}", 1)

	// The store section only takes effect on restart: nothing applies.
	writeAtomic(t, s.path, raised+"store: {url: memory, max_keys: 5}\n")
	err := s.waitReload(t)
	if !errors.Is(err, ErrRestartRequired) || !strings.Contains(err.Error(), "store changed") {
		t.Fatalf("store change: %v", err)
	}
	if a := s.check(t, `{"policy":"a","key":"w"}`); a.status != 200 || a.num("limit") != 5 {
		t.Fatalf("the rejected file's policy change applied: %s", a.raw)
	}

	// A file naming its own listen address, while --listen overrides it.
	writeAtomic(t, s.path, raised+"listen: 127.0.0.1:1\n")
	if err := s.waitReload(t); err != nil {
		t.Fatalf("reload with --listen set: %v", err)
	}
	if a := s.check(t, `{"policy":"a","key":"w"}`); a.num("limit") != 6 {
		t.Fatalf("the reload did not apply: %s", a.raw)
	}
	m := s.do(t, "GET", "/metrics", "").raw
	if !strings.Contains(m, `sluice_config_reloads_total{result="failure"} 1`) || !strings.Contains(m, `sluice_config_reloads_total{result="success"} 2`) {
		t.Errorf("reload metrics:\n%s", grep(m, "reloads_total"))
	}
	if l := logs.String(); strings.Contains(l, "listen address") || !strings.Contains(l, "takes a restart") {
		t.Errorf("logs:\n%s", l)
	}
}

// TestReloadWaitsForStableFile writes a file in place in two steps, the
// first of which is a valid config on its own: the reloader must load only
// the finished file, and a rewrite with the same content reloads nothing.
func TestReloadWaitsForStableFile(t *testing.T) {
	const (
		initial = "policies:\n  z: {limit: 1/s}\n"
		half    = "policies:\n  a: {limit: 5/s}\n"
		rest    = "  b: {limit: 2/s}\n"
	)
	if _, err := config.Parse("half", []byte(half)); err != nil {
		t.Fatalf("the half-written file must be valid on its own for this test to mean anything: %v", err)
	}
	path, wait, reads := startHalfWriteReloader(t, initial, half, rest, nil, nil)
	if err := os.WriteFile(path, []byte(half), 0o600); err != nil { // in place
		t.Fatal(err)
	}
	if c := wait(); len(c.Policies) != 2 {
		t.Fatalf("loaded a half-written file: policies %v", c.PolicyNames())
	}
	// The same content again: once the reloader has read it twice (settled),
	// write a real change; the next reload must be that one.
	r0 := reads.Load()
	writeAtomic(t, path, half+rest)
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool { return reads.Load() >= r0+2 }) {
		t.Fatal("the rewrite was not read")
	}
	writeAtomic(t, path, initial)
	if c := wait(); len(c.Policies) != 1 || c.Policies["z"] == nil {
		t.Fatalf("a rewrite without change reloaded, or the change did not: %v", c.PolicyNames())
	}
}

// TestReloadSignalWaitsForStableFile: a SIGHUP that arrives while the
// file is being written in place reloads the finished file, as a file
// event does, not the half read first, though that half is a valid config
// on its own (here a tier that has lost its second policy). It reloads
// once the file has settled even when the content is unchanged, since a
// signal asks for a reload.
func TestReloadSignalWaitsForStableFile(t *testing.T) {
	const (
		initial = "policies:\n  a: {limit: 5/s}\n  b: {limit: 2/s}\ntiers:\n  t:\n    policies:\n      - a\n      - b\n"
		half    = "policies:\n  a: {limit: 5/s}\n  b: {limit: 2/s}\ntiers:\n  t:\n    policies:\n      - a\n"
		rest    = "      - b\n"
	)
	if c, err := config.Parse("half", []byte(half)); err != nil || len(c.Tiers["t"].Policies) != 1 {
		t.Fatalf("the half-written file must be valid on its own, with one policy in t, for this test to mean anything: %v", err)
	}
	signals := make(chan os.Signal, 1)
	_, wait, _ := startHalfWriteReloader(t, initial, half, rest, signals, func(path string) {
		// The writer has written the first part, in place, before the
		// reloader watches: only the signal makes it read.
		if err := os.WriteFile(path, []byte(half), 0o600); err != nil {
			t.Fatal(err)
		}
	})
	signals <- syscall.SIGHUP
	if c := wait(); len(c.Tiers["t"].Policies) != 2 {
		t.Fatalf("SIGHUP loaded a half-written file: tier t has %d policies", len(c.Tiers["t"].Policies))
	}
	// The same content, signalled again: reloaded all the same.
	signals <- syscall.SIGHUP
	if c := wait(); len(c.Tiers["t"].Policies) != 2 {
		t.Fatalf("second SIGHUP: tier t has %d policies", len(c.Tiers["t"].Policies))
	}
}

// startHalfWriteReloader runs a Reloader of a service on the memory store,
// its file (returned) holding initial, whose writer appends rest the first
// time the reloader reads exactly half: a file written in place while it
// is read. before, when not nil, runs before the reloader watches; signals
// are its SIGHUPs. wait returns the next config reloaded; reads counts the
// file's reads.
func startHalfWriteReloader(t *testing.T, initial, half, rest string, signals chan os.Signal, before func(path string)) (string, func() *config.Config, *atomic.Int32) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeAtomic(t, path, initial)
	cfg, err := config.Parse(path, []byte(initial))
	if err != nil {
		t.Fatal(err)
	}
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv, err := New(Options{Store: st, Config: cfg, Metrics: metrics.New(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(path)
	}
	reloads := make(chan *config.Config, 8)
	var appended sync.Once
	reads := new(atomic.Int32)
	rl := &Reloader{Path: path, Server: srv, Logger: slog.New(slog.DiscardHandler), Signals: signals, last: []byte(initial), still: 300 * time.Millisecond,
		OnReload: func(c *config.Config, err error) {
			if err != nil {
				t.Errorf("reload: %v", err)
			}
			reloads <- c
		},
	}
	rl.afterRead = func(n int) {
		reads.Add(1)
		if n != len(half) {
			return
		}
		// The writer is not done: the rest arrives after the first read.
		appended.Do(func() {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			if _, err := f.WriteString(rest); err != nil {
				t.Error(err)
			}
		})
	}
	if err := rl.Watch(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	wait := func() *config.Config {
		t.Helper()
		select {
		case c := <-reloads:
			return c
		case <-time.After(10 * time.Second):
			t.Fatal("no reload within 10s")
			return nil
		}
	}
	return path, wait, reads
}
