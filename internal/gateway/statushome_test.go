package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/regiontest"
	"github.com/sluice-io/sluice/region"
)

// homePeeks counts the peeks of global keys a region's store sends to a
// home across the link: the reads of /v1/status (fetches are OpAllow,
// epoch checks read the marker with a GET).
type homePeeks struct {
	sluice.Store
	n atomic.Int64
}

func (h *homePeeks) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	if _, global := region.KeyScope(req.Key); global && op == sluice.OpPeek {
		h.n.Add(1)
	}
	return h.Store.Apply(ctx, op, req)
}

// An org's $1.00 monthly budget with scope global, home eu, and a
// gateway in each region of the World. /v1/status in ap, which holds no
// share of it, answers the budget's global remaining, read at the home:
// what eu's status answers after spending in eu (before, ap answered
// $0.000000 left, its share), with decided_by share and remaining_source
// home. In us, which spent from its share, it is the home's remaining
// plus us's share. A flood of status calls in ap reads the home once per
// key and homeStatusReuse, and with ap cut off from eu, status answers
// within its timeout from the share, saying so (remaining_source share).
func TestGlobalStatusAcrossRegions(t *testing.T) {
	w := regiontest.NewWorld(t)
	org := uniqueName(t)
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, PromptTokens: 5, CachedTokens: 2, CompletionTokens: 200})
	doc := strings.Replace(hardStopDoc, "%[4]s", org, -1)
	doc = strings.Replace(doc, "timezone: Europe/Berlin}]}", "timezone: Europe/Berlin}], scope: global, home: eu}", 1)
	apHome := &homePeeks{}
	urls, stores, settled, gws := regionGatewaysTuned(t, w, doc, up, 100, func(r string, o *region.Options) {
		if r == "ap" {
			apHome.Store = o.Regions["eu"]
			o.Regions["eu"] = apHome
		}
	})
	// One clock for the gateways' caches, moved past them by the test.
	var skew atomic.Int64
	for _, gw := range gws {
		gw.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
		// Generous on a loaded host (a read from ap is a 300 ms round
		// trip, two when the peek's script is loaded first); the default,
		// homeStatusTimeout, is set below for the partition.
		gw.homeReads.timeout = 10 * time.Second
	}
	expire := func() { skew.Add(int64(2 * homeStatusReuse)) }
	spend := func(r, n int) {
		t.Helper()
		for range n {
			req, _ := http.NewRequest(http.MethodPost, urls[r]+"/v1/chat/completions",
				strings.NewReader(`{"model":"gpt-test","messages":[{"role":"user","content":"a short note"}],"max_tokens":2000}`))
			req.Header.Set("Authorization", "Bearer "+clientKey)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("%s: status %d", regiontest.Regions[r], res.StatusCode)
			}
			select {
			case <-settled:
			case <-time.After(10 * time.Second):
				t.Fatal("no settlement in 10s")
			}
		}
	}
	// budget returns the org budget's row of r's /v1/status for key.
	budget := func(r int, key string) StatusBudget {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, urls[r]+"/v1/status", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var st Status
		if err := json.NewDecoder(res.Body).Decode(&st); err != nil || res.StatusCode != 200 {
			t.Fatalf("status %d: %v", res.StatusCode, err)
		}
		for _, b := range st.Budgets {
			if b.Scope == "org "+org {
				return b
			}
			if b.DecidedBy != "" || b.RemainingSource != "" {
				t.Errorf("regional budget %+v", b)
			}
		}
		t.Fatalf("no org budget in %+v", st)
		return StatusBudget{}
	}
	usd := func(s string) pricing.Micros {
		t.Helper()
		m, err := pricing.ParseUSD(s)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}

	// Spent in eu only: no region holds a share.
	spend(0, 3)
	eu, ap := budget(0, clientKey), budget(2, clientKey)
	if eu.DecidedBy != "home" || eu.RemainingSource != "home" || usd(eu.RemainingUSD) >= pricing.Dollar {
		t.Fatalf("eu: %+v", eu)
	}
	if ap.DecidedBy != "share" || ap.RemainingSource != "home" || ap.RemainingUSD != eu.RemainingUSD || ap.SpentUSD != eu.SpentUSD {
		t.Fatalf("ap answers %+v; eu, the home, %+v", ap, eu)
	}
	if ap.ResetSeconds < eu.ResetSeconds-1 || ap.ResetSeconds > eu.ResetSeconds+1 {
		t.Fatalf("ap's reset %ds, the home's %ds", ap.ResetSeconds, eu.ResetSeconds)
	}

	// Spent in us too, from its share: us answers the home's remaining
	// and its share. A fetch us sent while spending may still be on its
	// way (charged at home, not yet credited to the share): the rows are
	// compared once a read finds the share and the home as the one before
	// it did (fetches follow demand, which has stopped).
	spend(1, 3)
	var key sluice.Request
	cl := gws["us"].keys[sluice.HashKey(clientKey)]
	for i, s := range cl.levels.specs {
		if s.scope() == "org "+org {
			key = sluice.Request{Key: cl.levels.keys[i], Algorithm: s.alg, Limit: s.limit}
		}
	}
	share := func() int64 {
		t.Helper()
		sh, err := stores["us"].Apply(context.Background(), sluice.OpPeek, key)
		if err != nil || sh.Source != sluice.FromShare || sh.Remaining <= 0 {
			t.Fatalf("us's share: %+v %v", sh, err)
		}
		return sh.Remaining
	}
	var us StatusBudget
	for try := 0; ; try++ {
		expire()
		s1, h1 := share(), budget(0, clientKey)
		eu, us, ap = budget(0, clientKey), budget(1, clientKey), budget(2, clientKey)
		if s2, h2 := share(), budget(0, clientKey2); s1 == s2 && h1.RemainingUSD == eu.RemainingUSD && eu.RemainingUSD == h2.RemainingUSD {
			if us.RemainingSource != "home" || usd(us.RemainingUSD) != usd(eu.RemainingUSD)+pricing.Micros(s1) {
				t.Fatalf("us answers %+v; the home %s, us's share %d", us, eu.RemainingUSD, s1)
			}
			if ap.RemainingUSD != eu.RemainingUSD {
				t.Fatalf("ap answers %s left, the home %s", ap.RemainingUSD, eu.RemainingUSD)
			}
			break
		}
		if try == 20 {
			t.Fatalf("the share and the home still moved after %d reads", try)
		}
	}
	t.Logf("us answers %s left (the home %s, its share %s)", us.RemainingUSD, eu.RemainingUSD, pricing.Micros(usd(us.RemainingUSD)-usd(eu.RemainingUSD)))

	// A flood of status calls in ap, from both keys of the org: one
	// read at the home.
	expire()
	before := apHome.n.Load()
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			if b := budget(2, []string{clientKey, clientKey2}[i%2]); b.RemainingUSD != eu.RemainingUSD {
				t.Errorf("in the flood: %+v", b)
			}
		})
	}
	wg.Wait()
	if n := apHome.n.Load() - before; n != 1 {
		t.Fatalf("40 status calls in ap read the home %d times, want 1", n)
	}

	// Cut off from the home: the share's figure, said to be the share's,
	// within the timeout; the next call at once, from the kept failure.
	w.Links[[2]string{"ap", "eu"}].Partition()
	gws["ap"].homeReads.timeout = homeStatusTimeout
	expire()
	t0 := time.Now()
	ap = budget(2, clientKey)
	if el := time.Since(t0); ap.RemainingSource != "share" || ap.DecidedBy != "share" || ap.RemainingUSD != "0.000000" || el > homeStatusTimeout+2*time.Second {
		t.Fatalf("cut off: %+v in %s", ap, el)
	}
	n := apHome.n.Load()
	skew.Add(int64(statusReuse)) // past the status memo, not the kept failure
	if ap = budget(2, clientKey2); ap.RemainingSource != "share" || apHome.n.Load() != n {
		t.Fatalf("the second call: %+v, %d more reads", ap, apHome.n.Load()-n)
	}
}
