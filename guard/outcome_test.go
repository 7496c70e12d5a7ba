package guard

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// A refund or a charge that failed says whether it may have been applied:
// not after an open circuit or a busy key (never sent), and possibly after
// a deadline (the store may run it late). It used to say "not applied" in
// every case, and a caller that sent a refund again after a deadline
// could refund twice.
func TestSettlingErrorsTellWhetherSent(t *testing.T) {
	f := newFaulty(t)
	g := newGuard(t, f, Options{Timeout: 20 * time.Millisecond, ProbeInterval: 10 * time.Millisecond})
	ctx := context.Background()
	slow := "slow"
	f.holdKey.Store(&slow)
	for _, op := range []sluice.Op{sluice.OpRefund, sluice.OpCharge} {
		_, err := g.Apply(ctx, op, req(slow, 10))
		if !errors.Is(err, ErrDeadline) || !strings.Contains(err.Error(), "may have been applied") {
			t.Fatalf("%s past the deadline: %v", op, err)
		}
	}
	f.holdKey.Store(nil)
	f.down.Store(true)
	eventually(t, "circuit open", func() bool { return g.Stats().Open == 1 })
	for _, op := range []sluice.Op{sluice.OpRefund, sluice.OpCharge} {
		_, err := g.Apply(ctx, op, req("k", 10))
		if !errors.Is(err, ErrCircuitOpen) || !strings.Contains(err.Error(), "not sent") {
			t.Fatalf("%s with the circuit open: %v", op, err)
		}
	}
}
