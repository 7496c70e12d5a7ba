package region

// Sharing by demand. The home serves charges as they come, so when a key
// is at its limit the regions nearest the home would take more of it: the
// home region's own calls take each unit as it refills, and a far
// region's fetch lands a one-way trip after it was timed (at twice the
// limit, even demand: eu, the home, 569-784 admitted, ap, 150ms away,
// 69-127 of ~1240). So each global bucket key (GCRA, token bucket) has a
// demand table at its home (lua/fair.lua, `sluice:fair:<key>`, one hash in
// the home's Redis): every fetch reports its instance's demand (the
// moving average of the units it was asked for, admitted or not), and the
// home region's instances report theirs every fairEvery. While the
// regions' demand together is under the key's rate, or the home's store
// was not seen short (a denial, a short allotment) in the last fairFresh,
// nothing changes: each fetch is charged at home as it comes. Otherwise
// the key is at its limit:
//
//   - the home region's instances, every fairEvery (allotLoop), charge
//     what the home's store holds (OpAllow, up to C) and allot it to the
//     regions' pools in the table in proportion to their demand, each pool
//     up to max(C, r·fairPoolSpan) × its part (what a full pool would not
//     take goes to the others, the rest back to the store); when none did
//     for 4 × fairEvery (no traffic there), the first instance of any
//     region to ask does;
//   - a fetch takes its units from its region's pool, one script at the
//     home, instead of charging the store;
//   - the home region decides the key from a share too (fetched from its
//     pool like the others), so its calls wait for their part as the far
//     regions' do.
//
// Every unit in a pool was charged at home before, and is credited to a
// share once, so the bound is unchanged (C + r·t + 1 from a key's first
// request); the pools add to what is held at an instant (H, at most
// max(C, r·fairPoolSpan)). A pool whose region's demand went stale is
// refunded at home; an allotment whose reply was lost is not (the script
// may have run: under-admission only). A far region's pool fills while its
// fetches travel, so it is not raced by the near ones for each unit of
// the refill. Fixed windows are not shared (their refill is the next
// window, and a window's share ends with its window).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
)

// Bounds of the demand table.
const (
	// fairPrefix names a key's demand table at its home.
	fairPrefix = "sluice:fair:"
	// fairFresh is how long an instance's report of its demand counts.
	fairFresh = 2 * time.Second
	// fairMaxInstances bounds the reports a table counts (it holds one
	// field per instance and one per region).
	fairMaxInstances = 64
	// fairEvery is how often an instance of the home region reports its
	// demand on a key it decides, and, while the key is at its limit,
	// how often the home's refill is allotted to the regions' pools.
	fairEvery = 50 * time.Millisecond
	// fairPoolSpan is how much of the refill the pools hold at most,
	// together, when the burst is smaller: a far region takes its part
	// of a round trip (300ms) per fetch.
	fairPoolSpan = time.Second
	// fairAskMin is the least time an ask of the table is given (four
	// fetch round trips when longer).
	fairAskMin = 250 * time.Millisecond
	// fairGC is how long a table outlives its last report.
	fairGC = 10 * time.Second
)

// fairGrant is the demand table's answer.
type fairGrant struct {
	n     int64         // units granted from the pool (ask) or allotted (allot)
	sat   bool          // the key is at its limit: its refill is shared by demand
	wait  time.Duration // until the region's pool may hold the ask
	freed int64         // units charged at home that the caller refunds there
	due   bool          // the caller is to allot the home's refill now
}

// newInstanceID names this instance in the demand tables.
func newInstanceID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// fairClient is the Redis client of req's home, when req's key is shared
// by demand: a bucket (a window's share ends with its window, and its
// refill is the next window) whose home is a Redis. Nil otherwise.
func (s *Store) fairClient(req *sluice.Request) rueidis.Client {
	if req.Algorithm == sluice.FixedWindow {
		return nil
	}
	return s.homeClient(s.home(req.Key))
}

// fairInterval is how often req's key's demand is reported from its home
// region and, while the key is at its limit, its refill allotted:
// fairEvery, or the time the key takes to refill one unit when longer
// (sooner, there is nothing to allot), at most a quarter of fairFresh so
// that the reports stay counted. A key at 1/min denied to a client that
// keeps asking cost its home a table call every 50ms, 20 a second per
// key, whatever the client's own rate: a client spread over many such
// keys made the home's Redis do far more work than its requests
// (TestFairIntervalFollowsRefill).
func fairInterval(req *sluice.Request) time.Duration {
	l := req.Limit
	if l.Rate <= 0 {
		return fairEvery
	}
	return min(max(fairEvery, time.Duration(float64(l.Period)/float64(l.Rate))), fairFresh/4)
}

// table runs op ("ask" or "allot") on req's key's demand table at home:
// it reports this instance's demand (ask) and takes up to n units from
// its region's pool, or allots n units charged at home to the pools.
func (s *Store) table(ctx context.Context, hc rueidis.Client, op string, req *sluice.Request, demand float64, n int64, short bool) (fairGrant, error) {
	l := req.Limit
	rate := float64(l.Rate) / l.Period.Seconds()
	pools := max(float64(req.Capacity()), rate*fairPoolSpan.Seconds())
	vs, err := s.led.s.fair.Exec(ctx, hc, []string{fairPrefix + req.Key}, []string{
		s.led.now(), op, s.id, s.region,
		strconv.FormatFloat(demand, 'f', 3, 64), strconv.FormatInt(n, 10),
		strconv.FormatFloat(rate, 'f', 6, 64), strconv.FormatFloat(pools, 'f', 3, 64),
		strconv.FormatInt(fairFresh.Milliseconds(), 10), strconv.Itoa(fairMaxInstances), strconv.FormatInt(fairGC.Milliseconds(), 10),
		strconv.FormatInt(fairInterval(req).Milliseconds(), 10), flag(short), flag(s.home(req.Key) == s.region),
	}).ToArray()
	if err != nil {
		return fairGrant{}, unavailable("demand table", err)
	}
	v, err := ints(vs, 6)
	if err != nil {
		return fairGrant{}, fmt.Errorf("region: demand table: %w", err)
	}
	if v[0] < 0 || v[0] > n || v[4] < 0 {
		return fairGrant{}, fmt.Errorf("region: demand table %s: %d of %d, %d freed", op, v[0], n, v[4])
	}
	return fairGrant{n: v[0], sat: v[1] == 1, wait: time.Duration(max(v[3], 0)) * time.Millisecond, freed: v[4], due: v[5] == 1}, nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// fairTicket is an ask of the demand table beside a fetch's charge.
type fairTicket struct {
	done chan struct{}
	g    fairGrant
	err  error
}

// ask asks req's key's demand table for n units of this region's pool,
// reporting this instance's demand: at once when the key was at its limit
// at the last ask (the fetch then takes its units from the pool only),
// else beside the charge (no added round trip). Nil when the key is not
// shared by demand.
func (s *Store) ask(ctx context.Context, home sluice.Store, e *entry, req *sluice.Request) (t *fairTicket, sat bool) {
	hc := s.fairClient(req)
	if hc == nil {
		return nil, false
	}
	e.mu.Lock()
	sat, demand, short, lat := e.fairSat, e.rate, e.short, e.lat
	e.mu.Unlock()
	t = &fairTicket{done: make(chan struct{})}
	r := *req // the fetch changes its own as the home answers
	// The ask is bounded by a few of the key's fetch round trips, so that
	// a home that does not answer leaves the fetch its time to charge the
	// store instead (and fail there): with the fetch's whole timeout, a
	// far region's fetches after a home restart came 2.5 s apart and its
	// failure policy answered for seconds.
	to := min(s.fetchTO, max(time.Duration(4*lat), fairAskMin))
	run := func() {
		defer close(t.done)
		actx, cancel := context.WithTimeout(ctx, to)
		defer cancel()
		t.g, t.err = s.table(actx, hc, "ask", &r, demand, r.Cost, short)
		e.mu.Lock()
		if t.err != nil {
			e.epochStale = true // a call to the home failed (epoch.go)
			e.mu.Unlock()
			s.st.fairErrors.Add(1)
			return
		}
		e.fairSat = t.g.sat
		// A key no longer at its limit: its fetches charge the home's
		// store again. The table may have gone with the home's state (a
		// restart without persistence): check the epoch beside the next
		// fetch, as after a failed call, since the fetches from pools
		// did not call the store and saw no failure.
		e.epochStale = e.epochStale || (sat && !t.g.sat)
		e.mu.Unlock()
		s.refundFreed(home, &r, t.g.freed)
		if t.g.due {
			s.inflight.Go(func() {
				actx, cancel := context.WithTimeout(context.Background(), s.fetchTO)
				defer cancel()
				_ = s.allot(actx, home, hc, &r)
			})
		}
	}
	if sat {
		run()
	} else {
		go run()
	}
	return t, sat
}

// refundFreed refunds at home, in the background, the units of pools
// whose regions' demand went stale.
func (s *Store) refundFreed(home sluice.Store, req *sluice.Request, n int64) {
	if n <= 0 {
		return
	}
	r := *req
	s.inflight.Go(func() { s.refund(home, r, n) })
}

// reportHome reports the demand of a key this region is the home of,
// and whether the store denied its last decision here, every fairEvery at
// most, in the background, and while the key is at its limit allots the
// store's refill to the regions' pools. It reports
// whether the key was at its limit at the last report: then applyHome
// decides it from a share.
func (s *Store) reportHome(e *entry, req *sluice.Request, now int64) bool {
	e.mu.Lock()
	sat := e.fairSat
	e.shared = e.shared || sat
	if e.fairBusy || now-e.fairAt < int64(fairInterval(req)) {
		e.mu.Unlock()
		return sat
	}
	e.fairBusy, e.fairAt = true, now
	demand := e.rate
	r := *req
	r.MaxWait, r.Lease, r.UseLease = 0, "", false
	e.mu.Unlock()
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return sat
	}
	s.inflight.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.fetchTO)
		defer cancel()
		g, err := s.table(ctx, s.led.client, "ask", &r, demand, 0, e.homeShort.Load())
		e.mu.Lock()
		e.fairBusy = false
		if err == nil {
			// Out of the share mode: check the epoch before the next
			// decision on the store (as ask does).
			e.epochStale = e.epochStale || (e.fairSat && !g.sat)
			e.fairSat = g.sat
		} else {
			e.epochStale = true
		}
		e.mu.Unlock()
		if err != nil {
			s.st.fairErrors.Add(1)
			return
		}
		if g.sat {
			s.hot.Store(r.Key, e)
		} else {
			s.hot.Delete(r.Key)
		}
		s.refundFreed(s.local, &r, g.freed)
		if g.due {
			_ = s.allot(ctx, s.local, s.led.client, &r)
		}
	})
	return sat
}

// allotLoop reports, every fairEvery, the keys this region is the home of
// that are at their limit, and so allots their refill in time whatever
// this region's own traffic on them (its reports ride on its decisions
// otherwise: a home region with 5 % of the demand, its calls 200ms apart,
// allotted every 200ms, and its pools filled in lumps the far regions
// waited for).
func (s *Store) allotLoop() {
	t := time.NewTicker(fairEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			now := s.clk.Now()
			s.hot.Range(func(key string, e *entry) bool {
				e.mu.Lock()
				req := e.req
				e.mu.Unlock()
				s.reportHome(e, &req, now)
				return true
			})
		}
	}
}

// allot charges what the home's store (hs, its Redis hc) holds of req's
// key, up to its capacity, and allots it to the regions' pools by demand;
// what the pools do not take is refunded.
func (s *Store) allot(ctx context.Context, hs sluice.Store, hc rueidis.Client, req *sluice.Request) error {
	q := *req
	q.Cost = q.Capacity()
	q.MaxWait, q.Lease, q.UseLease = 0, "", false
	d, err := hs.Apply(ctx, sluice.OpAllow, q)
	if err == nil && !d.Degraded && !d.Allowed && d.Remaining > 0 && d.Remaining < q.Cost {
		q.Cost = d.Remaining
		d, err = hs.Apply(ctx, sluice.OpAllow, q)
	}
	if err != nil || d.Degraded || !d.Allowed {
		return err
	}
	g, err := s.table(ctx, hc, "allot", &q, 0, q.Cost, q.Cost < q.Capacity())
	if err != nil {
		// The script may have run (a reply lost, or one out of range):
		// the units may be in the pools, so they are not refunded
		// (refunding them let 1343 through a 1300 bound when a rounding
		// error made the reply out of range). Under-admission only.
		s.st.stranded.Add(uint64(q.Cost))
		return err
	}
	s.st.allotted.Add(uint64(g.n))
	s.refundFreed(hs, &q, g.freed)
	return nil
}
