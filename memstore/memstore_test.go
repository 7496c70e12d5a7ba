package memstore_test

import (
	"testing"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/storetest"
)

func newStore(t *testing.T, clk *clock.Fake) sluice.Store {
	s, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, newStore) }

func TestLogRuns(t *testing.T) {
	storetest.RunLogRuns(t, newStore, func(t *testing.T, s sluice.Store, key string) int {
		return s.(*memstore.Store).LogRuns(key)
	})
}
