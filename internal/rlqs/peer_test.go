package rlqs_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestPeerFleet drives the simulated fleet (five Envoys, one with 60 % of
// the demand, reports coincident) against a quota service running
// elsewhere, for a side-by-side run (docs/BENCHMARKS.md): it does nothing
// unless RLQS_PEER_ADDR names the service's address. RLQS_PEER_DEMAND is
// the fleet's demand as a multiple of RLQS_PEER_LIMIT (default 1.5 and
// 500/s), RLQS_PEER_SECONDS the run's length (default 10). It prints the
// requests the fleet decided, what it admitted, and the most in any 1 s
// window after the first 3 s.
func TestPeerFleet(t *testing.T) {
	addr := os.Getenv("RLQS_PEER_ADDR")
	if addr == "" {
		t.Skip("set RLQS_PEER_ADDR to run against another quota service")
	}
	env := func(k string, d float64) float64 {
		if v, err := strconv.ParseFloat(os.Getenv(k), 64); err == nil {
			return v
		}
		return d
	}
	demandX, limit, secs := env("RLQS_PEER_DEMAND", 1.5), env("RLQS_PEER_LIMIT", 500), env("RLQS_PEER_SECONDS", 10)
	length := time.Duration(secs * float64(time.Second))
	start := time.Now().Add(200 * time.Millisecond)
	rec := newRecorder(start, length)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	envoys := make([]*simEnvoy, fleetEnvoys)
	for i := range envoys {
		share := 0.1
		if i == 0 {
			share = 0.6
		}
		envoys[i] = &simEnvoy{addrs: []string{addr}, domain: "envoy", id: map[string]string{"route": "api"}, interval: fleetInterval, record: rec.record}
		d := share * demandX * limit
		wg.Add(1)
		go func() { defer wg.Done(); envoys[i].run(ctx, start, 0, func() float64 { return d }) }()
	}
	time.Sleep(time.Until(start.Add(length))) // the run's length
	cancel()
	wg.Wait()
	var decided, admitted uint64
	for _, e := range envoys {
		e.mu.Lock()
		decided += e.decided
		e.mu.Unlock()
	}
	admitted = uint64(rec.between(0, length))
	var worst int64
	for from := 3 * time.Second; from+time.Second <= length; from += 10 * time.Millisecond {
		worst = max(worst, rec.between(from, from+time.Second))
	}
	settled := float64(rec.between(3*time.Second, length)) / (limit * (length - 3*time.Second).Seconds())
	t.Logf("PEER decided=%d admitted=%d utilization_after_3s=%.3f max_1s_window=%d (%.3f × the limit)", decided, admitted, settled, worst, float64(worst)/limit)
}
