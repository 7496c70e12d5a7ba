package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// CLIENT KILL of the fleet's connections in a loop: fetches and refunds
// fail on their way, some after Redis applied them (the reply lost). A
// fetch whose reply is lost grants nothing (lost capacity), a refund is
// never sent twice: the fleet stays within ideal + 1.
func TestFleetConnectionsKilled(t *testing.T) {
	srv := redistest.NewStandalone(t)
	kill := func(felt <-chan struct{}, done chan<- error) {
		ctx := context.Background()
		bound := time.Now().Add(2 * time.Second)
		for kills := 0; ; kills++ {
			if _, err := srv.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"); err != nil {
				done <- err
				return
			}
			select {
			case <-felt:
				if kills >= 10 {
					done <- nil
					return
				}
			default:
			}
			if time.Now().After(bound) {
				done <- nil // unfelt: the test fails on its degraded count
				return
			}
			time.Sleep(20 * time.Millisecond) // the fault's rhythm, not a synchronisation
		}
	}
	for _, c := range []struct {
		a   sluice.Algorithm
		lim sluice.Limit
		tr  traffic
	}{
		{sluice.GCRA, sluice.Limit{Rate: 5000, Period: time.Second, Burst: 1000}, skewed},
		{sluice.FixedWindow, sluice.Limit{Rate: 500, Period: 100 * time.Millisecond}, uniform},
	} {
		t.Run(c.a.String()+"/"+c.tr.name, func(t *testing.T) {
			req := sluice.Request{Key: redistest.Prefix(t) + "hot", Algorithm: c.a, Limit: c.lim, Cost: 1}
			faulted := make(chan error, 1)
			r := runFleet(t, srv, req, c.tr, 1500*time.Millisecond, func(felt <-chan struct{}) { kill(felt, faulted) })
			if err := <-faulted; err != nil {
				t.Fatalf("CLIENT KILL: %v", err)
			}
			ideal, _ := bounds(c.lim, c.a, r.start, r.end, r.drained, r.stopped)
			t.Logf("admitted %d, ideal %.0f, degraded %d", r.admitted, ideal, r.degraded)
			if float64(r.admitted) > ideal+1 {
				t.Fatalf("admitted %d > ideal %.0f + 1", r.admitted, ideal)
			}
			if r.degraded == 0 {
				t.Fatal("no failed call: the kills did not bite")
			}
		})
	}
}
