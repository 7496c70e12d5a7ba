package upstream

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// pacedPool is one upstream model of l with the pace given, exact (no
// margin), leased or not.
func pacedPool(t *testing.T, l Limits, pace time.Duration, lease bool) (*Pool, *Route, func(time.Duration)) {
	t.Helper()
	defs := []Def{{Name: "az", Kind: Azure, BaseURL: "https://az.example", KeyEnv: "A", Pace: pace, Models: map[string]Limits{"dep": l}}}
	p, clk := testPool(t, defs, map[string][]Target{"m": {{Upstream: "az", Model: "dep"}}}, Routing{Lease: &lease})
	return p, p.Route("m", ""), func(d time.Duration) { clk.Advance(d) }
}

// TestPaceHoldsShortWindows: with pace: 1s, bursts and lulls never put
// more than a second's share of the minute's requests into any second,
// nor more than the limits into any minute, with leases and without; a
// reservation larger than a second's share of tokens still goes (tokens
// are not paced). Without a pace the same bursts put a minute's worth of
// requests into one second.
func TestPaceHoldsShortWindows(t *testing.T) {
	const rpm, tpm = 600, 60_000 // 10 requests and 1000 tokens a second
	run := func(pace time.Duration, lease bool) (perSecond, perMinute int64, tokSecond int64, admitted int) {
		p, r, advance := pacedPool(t, Limits{RPM: rpm, TPM: tpm}, pace, lease)
		rng := rand.New(rand.NewPCG(5, 6))
		type sent struct {
			at  time.Duration
			tok int64
		}
		var log []sent
		var now time.Duration
		for i := range 20_000 {
			step := time.Duration(rng.IntN(3)) * time.Millisecond
			if (i/1000)%2 == 1 {
				step = time.Duration(rng.IntN(40)) * time.Millisecond
			}
			advance(step)
			now += step
			tok := int64(1 + rng.IntN(80))
			if rng.IntN(50) == 0 {
				tok = 1500 // more than a second's share of tokens
			}
			g, _, err := p.Acquire(context.Background(), r, false, tok, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if g != nil {
				log = append(log, sent{now, tok})
			}
		}
		most := func(w time.Duration) (n, tk int64) {
			j := 0
			var cn, ct int64
			for i := range log {
				cn++
				ct += log[i].tok
				for log[i].at-log[j].at >= w {
					cn--
					ct -= log[j].tok
					j++
				}
				n, tk = max(n, cn), max(tk, ct)
			}
			return n, tk
		}
		perSecond, tokSecond = most(time.Second)
		perMinute, _ = most(time.Minute)
		return perSecond, perMinute, tokSecond, len(log)
	}
	for _, lease := range []bool{false, true} {
		s, m, ts, n := run(time.Second, lease)
		t.Logf("pace 1s, lease %v: %d admitted, at most %d a second (%d tokens), %d a minute", lease, n, s, ts, m)
		if s > rpm/60 || m > rpm {
			t.Fatalf("lease %v: %d requests in a second, %d in a minute", lease, s, m)
		}
		if ts < 1500 {
			t.Fatalf("lease %v: no 1500-token request went (at most %d tokens a second)", lease, ts)
		}
		if n < 2*rpm {
			t.Fatalf("lease %v: only %d admitted", lease, n)
		}
	}
	if s, _, _, _ := run(0, false); s <= rpm/60 {
		t.Fatalf("without a pace only %d in a second: the bursts do not test the pace", s)
	}
}

// TestPaceShareLargeLimits: the largest limit the config takes, paced at
// the longest pace, gets its share, not an overflow.
func TestPaceShareLargeLimits(t *testing.T) {
	p, r, _ := pacedPool(t, Limits{RPM: 1 << 40}, 30*time.Second, false)
	lim, ok := p.paceOf(r.Targets[0], limRPM, 1<<40)
	if want := int64(1<<40) / 2; !ok || lim.Rate < want*99/100 || lim.Rate > want {
		t.Fatalf("pace share %d, want about %d", lim.Rate, want)
	}
}
