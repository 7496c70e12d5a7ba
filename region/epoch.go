package region

// Epochs: a home that restarts without persistence (or is flushed, or
// replaced by an empty replica) forgets the charges it made, while the
// shares held elsewhere stay spendable and its own bucket is full again:
// up to C + H over the bound. (A failover to a replica that lags keeps
// the marker and is not caught: docs/regions.md.) So each global key
// carries an epoch marker at its home (lua/epoch.lua), a random id set at
// first use, written with the key's state and lost with it. Each
// instance remembers the id it last saw of a key (a region of other homes
// in its ledger too, so that its other instance and its restarts know
// it) and checks it before a decision at home, or beside a fetch (not
// before it: a cold key would wait two round trips), at most every
// EpochEvery and at once after a call to the home failed. When the home
// forgot the id, the instance that finds out charges the key's whole
// capacity at home (OpCharge C, a fixed window's limit), once per loss:
// the bucket is as if spent when the home came back, so it admits the
// refill only, r·t, for τ = C/r (a window: the rest of the window), and
//
//	admitted over [0, t] ≤ C + r·t + 2 (+ what the home region admitted
//	between the restart and its next check, and the fetches sent beside
//	the check that found the loss)
//
// as every unit spent before the restart was charged in the first life
// (≤ C + r·t_r + 1) and every one after in the second, where C was
// charged first (≤ r·(t − t_r) + 1).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
)

// DefaultEpochEvery is how often a key's epoch is checked at most.
const DefaultEpochEvery = time.Second

// epochPrefix names a key's epoch marker at its home.
const epochPrefix = "sluice:epoch:"

// clienter is a store with a Redis client: redisstore.Store.
type clienter interface{ Client() rueidis.Client }

// homeClient is the Redis client of a key's home, nil when its store has
// none (the epoch check is then off for it).
func (s *Store) homeClient(home string) rueidis.Client {
	if home == s.region {
		return s.led.client
	}
	if c, ok := s.regions[home].(clienter); ok {
		return c.Client()
	}
	return nil
}

// epochTTL is how long an epoch marker and a region's memory of it live
// after the last check: as long as a spent state takes to refill (C/r,
// or a window), and a minute.
func epochTTL(req *sluice.Request) time.Duration {
	l := req.Limit
	d := l.Period
	if req.Algorithm != sluice.FixedWindow && l.Rate > 0 {
		d = time.Duration(float64(l.Period) * float64(req.Capacity()) / float64(l.Rate))
	}
	return d + time.Minute
}

// epochDue reports whether e's key's epoch is to be checked now: never
// checked by this instance, last checked EpochEvery ago, or a call to the
// home failed since. Called with e.mu held.
func (s *Store) epochDue(e *entry, now int64) bool {
	return s.epochEvery > 0 && (e.epochAt == 0 || e.epochStale || now-e.epochAt >= s.epochEvery)
}

// checkEpoch checks that the home of e's key still holds the state this
// region knew, and when it lost it, charges the key's capacity at home
// (quarantine). One check runs at a time per key and instance; a caller
// finding one in flight goes on. An error leaves the check due.
func (s *Store) checkEpoch(ctx context.Context, home string, hs sluice.Store, e *entry) error {
	hc := s.homeClient(home)
	if hc == nil {
		return nil
	}
	e.mu.Lock()
	if e.epochBusy || !s.epochDue(e, s.clk.Now()) {
		e.mu.Unlock()
		return nil
	}
	e.epochBusy = true
	seen, req := e.epoch, e.req
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.epochBusy = false
		e.mu.Unlock()
	}()
	ttl := epochTTL(&req)
	remote := home != s.region
	if seen == "" && remote {
		// What this region's other instances, or this one before a
		// restart, saw.
		v, err := s.led.client.Do(ctx, s.led.client.B().Get().Key(s.led.key(req.Key)+":ep").Build()).ToString()
		if err != nil && !rueidis.IsRedisNil(err) {
			return unavailable("epoch memory", err)
		}
		seen = v
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	vs, err := s.led.s.epoch.Exec(ctx, hc, []string{epochPrefix + req.Key}, []string{hex.EncodeToString(b[:]), seen, fmt.Sprint(ttl.Milliseconds()), fmt.Sprint(s.fetchTO.Milliseconds())}).ToArray()
	if err != nil {
		return unavailable("epoch", err)
	}
	if len(vs) != 2 {
		return fmt.Errorf("region: epoch reply of %d values, want 2", len(vs))
	}
	cur, err := vs[0].ToString()
	if err != nil {
		return fmt.Errorf("region: epoch reply: %w", err)
	}
	lost, err := vs[1].AsInt64()
	if err != nil {
		return fmt.Errorf("region: epoch reply: %w", err)
	}
	if lost == 1 {
		// The home forgot: charge it as if its bucket were spent when it
		// came back. The marker stays flagged until the charge is made:
		// a charge that failed is made by a check FetchTimeout later (one
		// that was only slow is then made twice: under-admission only).
		q := req
		q.Cost = req.Capacity()
		q.MaxWait, q.Lease, q.UseLease = 0, "", false
		if _, err := hs.Apply(ctx, sluice.OpCharge, q); err != nil {
			return fmt.Errorf("region: quarantine of a key whose home lost its state: %w", err)
		}
		if err := hc.Do(ctx, hc.B().Set().Key(epochPrefix+req.Key).Value(cur).Xx().Px(ttl).Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
			return unavailable("epoch", err)
		}
		s.st.quarantines.Add(1)
		s.log.Warn("region: a home lost a global key's state: charged its capacity (quarantine)", "region", s.region, "home", home)
	}
	if remote {
		if err := s.led.client.Do(ctx, s.led.client.B().Set().Key(s.led.key(req.Key)+":ep").Value(cur).Px(ttl).Build()).Error(); err != nil {
			return unavailable("epoch memory", err)
		}
	}
	e.mu.Lock()
	e.epoch, e.epochAt, e.epochStale = cur, s.clk.Now(), false
	e.mu.Unlock()
	return nil
}
