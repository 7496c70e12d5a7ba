package regiontest

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/region"
)

// Regions are the World's regions.
var Regions = []string{"eu", "us", "ap"}

// OneWay is the latency between two of the World's regions, each way: 40
// ms eu-us, 80 ms us-ap, 150 ms eu-ap (the figures).
func OneWay(a, b string) time.Duration {
	pair := []string{a, b}
	slices.Sort(pair)
	switch strings.Join(pair, "-") {
	case "eu-us":
		return 40 * time.Millisecond
	case "ap-us":
		return 80 * time.Millisecond
	}
	return 150 * time.Millisecond // ap-eu
}

// World is three regions on one machine, each its own redis-server, each
// region reaching the others' through a WAN link.
type World struct {
	// Redis is each region's redis-server.
	Redis map[string]*redistest.Server
	// Links are the links between regions, by [from, to].
	Links map[[2]string]*WAN
}

// NewWorld starts the regions' redis-servers and links; they stop when
// the test ends. extra are arguments for every redis-server.
func NewWorld(t testing.TB, extra ...string) *World {
	t.Helper()
	w := &World{Redis: map[string]*redistest.Server{}, Links: map[[2]string]*WAN{}}
	for _, r := range Regions {
		w.Redis[r] = redistest.NewStandalone(t, extra...)
	}
	for _, a := range Regions {
		for _, b := range Regions {
			if a != b {
				w.Links[[2]string{a, b}] = NewWAN(t, w.Redis[b].Addr, OneWay(a, b))
			}
		}
	}
	return w
}

// Store opens one instance's region.Store in region r, as `sluice serve`
// opens it (internal/server/regions.go): its region's Redis as the local
// store and the ledger, the other regions' through the links, and the
// keys that doors mark global (region.GlobalKey) held global at the home
// their mark names or HashHome's. tune, when set, changes the options.
// It is closed when the test ends.
func (w *World) Store(t testing.TB, r string, tune func(*region.Options)) *region.Store {
	t.Helper()
	ctx := context.Background()
	open := func(url string, timeout time.Duration) (*redisstore.Store, error) {
		s, err := redisstore.New(ctx, redisstore.Options{URL: url, Timeout: timeout, DisableDenyCache: true})
		if err == nil {
			t.Cleanup(func() { _ = s.Close() })
		}
		return s, err
	}
	local, err := open(w.Redis[r].URL(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	stores := map[string]sluice.Store{r: local}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, h := range Regions {
		if h == r {
			continue
		}
		// At once: a store across a link takes a few round trips to
		// connect and load its scripts.
		wg.Go(func() {
			s, e := open(w.Links[[2]string{r, h}].URL(), 2*time.Second)
			mu.Lock()
			defer mu.Unlock()
			if e != nil {
				err = e
				return
			}
			stores[h] = s
		})
	}
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	hash := region.HashHome(Regions)
	opts := region.Options{
		Region:  r,
		Regions: stores,
		Ledger:  local.Client(),
		Global: func(req *sluice.Request) bool {
			_, ok := region.KeyScope(req.Key)
			return ok
		},
		Home: func(key string) string {
			if h, _ := region.KeyScope(key); h != "" {
				return h
			}
			return hash(key)
		},
		// Generous: a loaded machine stalls a call to the local Redis
		// for tens of ms at times.
		CallTimeout: time.Second,
		// One host, one clock.
		ClockSkew: 5 * time.Millisecond,
	}
	if tune != nil {
		tune(&opts)
	}
	s, err := region.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
