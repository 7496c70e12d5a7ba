package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

// BenchmarkLogGranularity: one OpAllow on a sliding window log of 10,000
// per minute under a steady stream of 9,900 per minute (one admission
// every 6.06ms of the test clock, all admitted: the granularity gives up
// at most g/Period = 0.5% of the rate), exact against a granularity of
// Period/200 (300ms), on real Redis. Each key starts a full minute into
// the stream: the exact log holds 9,900 runs, the granular one 201, and
// each decision reads and rewrites them all. Compare the two in one run:
//
//	go test -run '^$' -bench LogGranularity -benchtime 2000x -count 3 ./redisstore/
func BenchmarkLogGranularity(b *testing.B) {
	url := redistest.Standalone(b).URL()
	for _, g := range []time.Duration{0, time.Minute / 200} {
		name := "exact"
		if g > 0 {
			name = "granularity=" + g.String()
		}
		b.Run(name, func(b *testing.B) { benchLog(b, url, g) })
	}
}

func benchLog(b *testing.B, url string, g time.Duration) {
	const rate, period, stream = 10_000, time.Minute, 9_900
	const gap = period / stream
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 30, 0, 0, time.UTC))
	s := newStore(b, Options{URL: url, Clock: clk, DisableDenyCache: true})
	ctx := context.Background()
	req := sluice.Request{Key: redistest.Prefix(b) + "log", Algorithm: sluice.SlidingWindowLog,
		Limit: sluice.Limit{Rate: rate, Period: period, Granularity: g}, Cost: 1}
	// A minute of the stream, decided by package algo and written as the
	// script writes it: the key's steady state, without 10,000 calls of
	// the exact log to reach it.
	var st algo.State
	for range stream {
		clk.Advance(gap)
		var err error
		if _, st, err = algo.Apply(sluice.OpAllow, st, req, clk.Now()); err != nil {
			b.Fatal(err)
		}
	}
	c := s.Client()
	vals := make([]string, 0, len(st.Log))
	for _, r := range st.Log {
		v := strconv.FormatInt(r.At, 10)
		if r.N != 1 {
			v += "*" + strconv.FormatInt(r.N, 10)
		}
		vals = append(vals, v)
	}
	if err := c.Do(ctx, c.B().Del().Key(req.Key).Build()).Error(); err != nil {
		b.Fatal(err)
	}
	if err := c.Do(ctx, c.B().Rpush().Key(req.Key).Element(vals...).Build()).Error(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		clk.Advance(gap)
		d, err := s.Apply(ctx, sluice.OpAllow, req)
		if err != nil || !d.Allowed {
			b.Fatalf("%+v %v", d, err)
		}
	}
	b.StopTimer()
	n, err := c.Do(ctx, c.B().Llen().Key(req.Key).Build()).AsInt64()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(n), "runs")
}
