package lease_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/memstore"
)

// BenchmarkLeasedHotKey: decisions on 100 hot keys made from their leases
// (a lease over the memory store: the local path a leased Redis store
// takes for all but a chunk fetch in thousands), serial for callgrind and
// under RunParallel. bench/redis's LeaseHot runs it on Redis beside
// redis_rate.
func BenchmarkLeasedHotKey(b *testing.B) {
	mem, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = mem.Close() })
	s, err := lease.New(lease.Options{Store: mem, Instances: 3})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	lim := sluice.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
	reqs := make([]sluice.Request, 100)
	for i := range reqs {
		reqs[i] = sluice.Request{Key: "hot:" + strconv.Itoa(i), Algorithm: sluice.GCRA, Limit: lim, Cost: 1, UseLease: true}
	}
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			_, _ = s.Apply(ctx, sluice.OpAllow, reqs[i%len(reqs)])
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				_, _ = s.Apply(ctx, sluice.OpAllow, reqs[i%len(reqs)])
				i++
			}
		})
	})
	if st := s.Stats(); st.Hits == 0 {
		b.Fatalf("no decision from a lease: %+v", st)
	}
}

// BenchmarkLeasedBatch: the gateway's leased admission and settlement of
// one request on hot keys, from the leases alone: an ApplyAll of three
// leased members (its rpm, tpm and rpd), then a refund of two of them
// into the leases (SettleLocal), serial.
func BenchmarkLeasedBatch(b *testing.B) {
	mem, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = mem.Close() })
	s, err := lease.New(lease.Options{Store: mem})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	lim := sluice.Limit{Rate: 1 << 40, Period: time.Minute}
	reqs := []sluice.Request{
		{Key: "b:rpm", Algorithm: sluice.GCRA, Limit: lim, Cost: 1, UseLease: true},
		{Key: "b:tpm", Algorithm: sluice.TokenBucket, Limit: lim, Cost: 100, UseLease: true},
		{Key: "b:rpd", Algorithm: sluice.GCRA, Limit: lim, Cost: 1, UseLease: true},
	}
	refunds := make([]sluice.Request, 2)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.ApplyAll(ctx, sluice.OpAllow, reqs); err != nil {
			b.Fatal(err)
		}
		refunds[0], refunds[1] = reqs[1], reqs[2]
		refunds[0].Cost = 50
		_ = s.SettleLocal(sluice.OpRefund, refunds)
	}
	if st := s.Stats(); st.Hits == 0 {
		b.Fatalf("no decision from a lease: %+v", st)
	}
}
