package server

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/console"
	"github.com/sluice-io/sluice/internal/redistest"
)

// fleetSum is the decisions and denials of policy b in a fleet chart.
func fleetSum(t *testing.T, s *svc, rng string) (d, x float64) {
	t.Helper()
	a := s.do(t, "GET", "/ui/api/fleet?range="+rng, "")
	if a.status != 200 {
		t.Fatalf("fleet %s: %d %s", rng, a.status, a.raw)
	}
	var ch console.FleetChart
	if err := json.Unmarshal([]byte(a.raw), &ch); err != nil {
		t.Fatal(err)
	}
	for _, ser := range ch.Series {
		if ser.Policy == "b" {
			for _, p := range ser.Points {
				d, x = d+p.Decisions, x+p.Denials
			}
		}
	}
	return d, x
}

// TestConsoleFleetCharts: two replicas on one Redis; each replica's
// console charts the fleet's decisions, every range: the sum of both
// replicas' checks, and their denials.
func TestConsoleFleetCharts(t *testing.T) {
	srv := redistest.NewStandalone(t)
	cfg := redisConfig(srv.URL(), "fail_open") + "console: {enabled: true, sample_interval: 100ms, top_sample: 1, public_read: true}\n"
	a, b := startService(t, svcOptions{redis: true, config: cfg}), startService(t, svcOptions{redis: true, config: cfg})
	id := redistest.Prefix(t)
	for i := range 5 {
		a.check(t, fmt.Sprintf(`{"policy":"b","key":"%s-a"}`, id))
		b.check(t, fmt.Sprintf(`{"policy":"b","key":"%s-b%d"}`, id, i))
	}
	// 10 decisions: replica a's 5 (3 denied at 2/s), replica b's 5.
	for _, rng := range []string{"15m", "1h", "6h", "24h"} {
		var d, x float64
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if d, x = fleetSum(t, b, rng); d >= 10 {
				break
			}
		}
		if d != 10 || x < 2 || x > 3 {
			t.Errorf("range %s on replica b: %v decisions, %v denials; want 10, and 2 or 3", rng, d, x)
		}
	}
	if r := a.do(t, "GET", "/ui/api/fleet?range=7d", ""); r.status != 400 {
		t.Errorf("range 7d: %d %s", r.status, r.raw)
	}
}

// TestConsoleFleetNoRedisCallPerRequest: the fleet charts cost Redis one
// pipeline per replica and flush interval, never a call per decision:
// with a one-minute interval, hundreds of checks send at most the one
// flush's HINCRBY as the console starts.
func TestConsoleFleetNoRedisCallPerRequest(t *testing.T) {
	srv := redistest.NewStandalone(t)
	cfg := redisConfig(srv.URL(), "fail_open") + "console: {enabled: true, sample_interval: 1m, top_sample: 1, public_read: true}\n"
	s := startService(t, svcOptions{redis: true, config: cfg})
	start := time.Now()
	for i := range 300 {
		s.check(t, fmt.Sprintf(`{"policy":"a","key":"fleet-%d"}`, i%7))
	}
	n, err := srv.CommandCalls(context.Background(), "hincrby")
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 50*time.Second {
		t.Skip("the checks took longer than the flush interval: a flush may have run")
	}
	// The flush as the console starts (which may come after the first
	// checks) writes at most a field of decisions and one of denials per
	// range for the one series; a call per decision would be 300 or more.
	if most := int64(2 * len(console.Resolutions)); n > most {
		t.Fatalf("300 checks within a flush interval sent %d HINCRBY, want at most %d (one flush)", n, most)
	}
}
