package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/storetest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// newStore returns a store that t.Cleanup closes. Unless a test sets a
// Timeout, calls get 5s: the default 50ms would make tests that are not
// about failures flaky on a loaded machine under -race.
func newStore(t testing.TB, opts Options) *Store {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := New(ctx, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformanceStandalone(t *testing.T) {
	url := redistest.Standalone(t).URL()
	storetest.Run(t, func(t *testing.T, clk *clock.Fake) sluice.Store {
		return newStore(t, Options{URL: url, Clock: clk, Timeout: 5 * time.Second})
	})
}

func TestConformanceCluster(t *testing.T) {
	url := redistest.SharedCluster(t).URL()
	storetest.Run(t, func(t *testing.T, clk *clock.Fake) sluice.Store {
		return newStore(t, Options{URL: url, Clock: clk, Timeout: 5 * time.Second})
	})
}

// The conformance suite with fixed windows in per-window keys: with the
// test clock the plain path decides the one-key OpAllows of whole
// milliseconds, the scripts the rest.
func TestConformancePlainStandalone(t *testing.T) {
	conformancePlain(t, redistest.Standalone(t).URL())
}

func TestConformancePlainCluster(t *testing.T) {
	conformancePlain(t, redistest.SharedCluster(t).URL())
}

func conformancePlain(t *testing.T, url string) {
	var stores []*Store
	storetest.Run(t, func(t *testing.T, clk *clock.Fake) sluice.Store {
		s := newStore(t, Options{URL: url, Clock: clk, Timeout: 5 * time.Second, PlainWindows: true})
		stores = append(stores, s)
		return s
	})
	var plain uint64
	for _, s := range stores {
		plain += s.Stats().Plain
	}
	if plain < 100 { // the simulated day alone makes thousands
		t.Fatalf("%d plain calls: the plain path was not taken", plain)
	}
}

// The runs of a sliding window log are the entries of its Redis list.
func TestLogRuns(t *testing.T) {
	url := redistest.Standalone(t).URL()
	storetest.RunLogRuns(t, func(t *testing.T, clk *clock.Fake) sluice.Store {
		return newStore(t, Options{URL: url, Clock: clk})
	}, func(t *testing.T, s sluice.Store, key string) int {
		c := s.(*Store).Client()
		n, err := c.Do(context.Background(), c.B().Llen().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatalf("LLEN %s: %v", key, err)
		}
		return int(n)
	})
}
