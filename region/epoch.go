package region

// Epochs: a home that restarts without persistence (or is flushed, or
// replaced by an empty replica) forgets the charges it made, while the
// shares held elsewhere stay spendable and its own bucket is full again:
// up to C + H over the bound. A home that fails over to a replica that
// lags keeps its state but not its last charges (the fetches whose shares
// other regions spend, and its own region's decisions): up to the
// charges of the lag over the bound. So each global key carries an epoch
// marker at its home (lua/epoch.lua), a random id set at first use,
// written with the key's state and lost with it, in the key's hash slot,
// and stamped with the server's replication id (master_replid: the
// history of writes the server is the master of, which a promoted
// replica, or a server restarted from its files, changes). Each
// instance remembers the id it last saw of a key (a region of other homes
// in its ledger too, so that its other instance and its restarts know
// it) and checks it before a decision at home, or beside a fetch (not
// before it: a cold key would wait two round trips), at most every
// EpochEvery and at once after a call to the home failed. When the home
// forgot the id, or holds it under another history, the instance that
// finds out charges the key's whole capacity at home (OpCharge C, a fixed
// window's limit), once per loss: the bucket is as if spent when the home
// came back, so it admits the refill only, r·t, for τ = C/r (a window:
// the rest of the window), and
//
//	admitted over [0, t] ≤ C + r·t + 2 (+ what the home admitted, in its
//	region and by fetches, between the restart or failover and the
//	check that found it)
//
// as every unit spent before the restart or failover was charged in the
// first life (≤ C + r·t_r + 1: its charges that the replica missed
// included) and every one after the check in the second, where C was
// charged first (≤ r·(t − t_r) + 1). A replica's lag need not be known:
// whatever it missed was charged in the first life. The price is a
// quarantine per key on every failover and every restart, lagging or not
// (the replication id cannot tell appendfsync always, which loses
// nothing, from everysec, which loses up to a second): under-admission,
// at most C per key, once.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
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
	seen, req, owed := e.epoch, e.req, e.epochOwed
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
	cur, owe, err := s.verifyEpoch(ctx, hc, hs, req, seen, home, owed)
	if err != nil {
		e.mu.Lock()
		e.epochOwed = owe
		e.mu.Unlock()
		return err
	}
	if remote {
		if err := s.led.client.Do(ctx, s.led.client.B().Set().Key(s.led.key(req.Key)+":ep").Value(cur).Px(ttl).Build()).Error(); err != nil {
			return unavailable("epoch memory", err)
		}
	}
	e.mu.Lock()
	e.epoch, e.epochAt, e.epochStale, e.epochOwed = cur, s.clk.Now(), false, false
	e.mu.Unlock()
	return nil
}

// epochKey names the epoch marker of key, in key's Redis Cluster hash
// slot where it can (a key with a hash tag keeps it; a key with none and
// no '}' becomes the tag), so that on a Cluster the marker is on the node
// that holds the key's state, and its replication id is that node's.
// A key holding a '}' (a hash tag has one) keeps its own name after the
// prefix: its slot is its tag's when it has one, and otherwise, on a
// Cluster, the marker may sit on another node than the state.
func epochKey(key string) string {
	if strings.IndexByte(key, '}') >= 0 {
		return epochPrefix + key
	}
	return epochPrefix + "{" + key + "}"
}

// verifyEpoch runs the epoch check of req's key on hc, the Redis holding
// its state (lua/epoch.lua), seen the id the caller last saw of it, and
// when the state may have been lost there (the marker gone while seen is
// set, or the server's replication id changed since the marker was set:
// a failover to a replica, a restart from files), charges the key's
// capacity on st, the store over hc (quarantine), once per loss. where
// names the region of hc for the log. It returns the marker's id.
//
// owed says that this instance found a loss before and its charge failed:
// the marker is then flagged by its own earlier check, which the script
// answers as a quarantine under way (for FetchTimeout, so that two askers
// do not both charge), and the charge is made now all the same. A charge
// that fails returns owe, for the caller to pass as owed next time: a
// check that trusted its own flag left the fresh bucket admitting until
// the flag aged (TestAsyncEpochRememberedWhenIdle, 1 run in 10).
func (s *Store) verifyEpoch(ctx context.Context, hc rueidis.Client, st sluice.Store, req sluice.Request, seen, where string, owed bool) (cur string, owe bool, err error) {
	ttl := epochTTL(&req)
	var b [12]byte
	_, _ = rand.Read(b[:])
	mk := epochKey(req.Key)
	trust := "0"
	if s.trustHist {
		trust = "1"
	}
	vs, err := s.led.s.epoch.Exec(ctx, hc, []string{mk}, []string{hex.EncodeToString(b[:]), seen, fmt.Sprint(ttl.Milliseconds()), fmt.Sprint(s.fetchTO.Milliseconds()), trust}).ToArray()
	if err != nil {
		return "", owed, unavailable("epoch", err)
	}
	if len(vs) != 4 {
		return "", owed, fmt.Errorf("region: epoch reply of %d values, want 4", len(vs))
	}
	cur, err = vs[0].ToString()
	if err != nil {
		return "", owed, fmt.Errorf("region: epoch reply: %w", err)
	}
	lost, err := vs[1].AsInt64()
	if err != nil {
		return "", owed, fmt.Errorf("region: epoch reply: %w", err)
	}
	clear, err := vs[2].ToString()
	if err != nil {
		return "", owed, fmt.Errorf("region: epoch reply: %w", err)
	}
	if known, err := vs[3].AsInt64(); err == nil && known == 0 && s.infoWarned.CompareAndSwap(false, true) {
		s.log.Warn("region: a store's Redis refused INFO to the epoch check (ACL): a failover to a replica that lags, or a restart from files, is not caught there; grant +info", "region", s.region, "store", where)
	}
	if lost == 1 || owed {
		// The store forgot, or may have: charge it as if its bucket were
		// spent when it came back. The marker stays flagged until the
		// charge is made: a charge that failed is made by a check
		// FetchTimeout later (one that was only slow is then made twice:
		// under-admission only).
		q := req
		q.Cost = req.Capacity()
		q.MaxWait, q.Lease, q.UseLease = 0, "", false
		if _, err := st.Apply(ctx, sluice.OpCharge, q); err != nil {
			return "", true, fmt.Errorf("region: quarantine of a key whose store lost its state: %w", err)
		}
		if where == s.region && (s.async == nil || !s.async(&req)) {
			// This region's own share of the key (fair.go: the home
			// region spends one while the key is at its limit) lives on
			// the same Redis: after a failover it may hold units spent
			// since, and the quarantine charged them. Dropped (under-
			// admission only).
			if err := hc.Do(ctx, hc.B().Del().Key(s.led.key(req.Key)).Build()).Error(); err != nil {
				return "", false, unavailable("epoch", err)
			}
		}
		if err := hc.Do(ctx, hc.B().Set().Key(mk).Value(clear).Xx().Px(ttl).Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
			return "", false, unavailable("epoch", err)
		}
		s.st.quarantines.Add(1)
		s.log.Warn("region: a store lost a global key's state, or may have (restarted, failed over): charged its capacity (quarantine)", "region", s.region, "store", where)
	}
	return cur, false, nil
}

// The asynchronous mode's epochs. An asynchronous key is decided on each
// region's own store, which holds the region's admissions and the others'
// delivered counts: a region's Redis that restarts without persistence
// (or fails over to a replica that lags) forgets them, and its bucket is
// full again, up to C over the bound. So an asynchronous key carries an
// epoch marker on each region's store too, checked by the region's own
// instances as a home region checks its keys (at most every EpochEvery,
// at once after a call failed), but beside a decision rather than before
// it (startAsyncEpoch), and a store found to have lost the key's state is
// charged its capacity (on that store alone:
// the other regions lost nothing). Each instance remembers the id it saw
// in memory (the region's Redis is what may forget it), for as long as
// the state may matter (epochTTL), also after the key's counts are
// forgotten (asyncSeen).

// asyncSeen is an id an instance saw of an asynchronous key's marker on
// its region's store, remembered after the key's counts were forgotten,
// until exp (ns).
type asyncSeen struct {
	id  string
	exp int64
}

// asyncEpochDue reports whether c's key's epoch is to be checked at now.
// Called with c.mu held.
func (s *Store) asyncEpochDue(c *counts, now int64) bool {
	return s.epochEvery > 0 && !c.epochBusy && (c.epochAt == 0 || c.epochStale || now-c.epochAt >= s.epochEvery)
}

// startAsyncEpoch starts, when due, the check that this region's store
// still holds the state of c's key (lua/epoch.lua on the region's Redis),
// in the background, beside the decision: a check before it would double
// a cold key's latency (BenchmarkAsyncEpochCheck/cold: p50 ×2.3). A loss
// is then charged a local round trip after the first decision that could
// see it: the decisions in that span widen the bound (docs/regions.md).
// One check runs at a time per key and instance.
func (s *Store) startAsyncEpoch(c *counts) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if !s.asyncEpochDue(c, s.clk.Now()) {
		c.mu.Unlock()
		return
	}
	c.epochBusy = true
	c.mu.Unlock()
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		c.mu.Lock()
		c.epochBusy = false
		c.mu.Unlock()
		return
	}
	s.inflight.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.fetchTO)
		defer cancel()
		s.checkAsyncEpoch(ctx, c)
	})
}

// checkAsyncEpoch runs the check startAsyncEpoch started (c.epochBusy
// set): when this region's store lost the key's state, it charges the
// key's capacity there. A check that failed stays due.
func (s *Store) checkAsyncEpoch(ctx context.Context, c *counts) {
	c.mu.Lock()
	seen, req, owed := c.epoch, c.req, c.epochOwed
	c.mu.Unlock()
	if seen == "" {
		if m, ok := s.aseen.Load(req.Key); ok && m.exp > s.clk.Now() {
			seen = m.id
		}
	}
	cur, owe, err := s.verifyEpoch(ctx, s.led.client, s.local, req, seen, s.region, owed)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epochBusy = false
	if err != nil {
		c.epochStale, c.epochOwed = true, owe
		return
	}
	c.epoch, c.epochAt, c.epochStale, c.epochOwed = cur, s.clk.Now(), false, false
	if c.forgotten {
		// Forgotten while the check ran: keep what it saw.
		s.rememberAsyncEpoch(c)
	}
}

// rememberAsyncEpoch keeps the id c's key's marker had when its counts
// are forgotten, for as long as the state may matter; at most MaxKeys
// ids (past them, a key's loss is caught only if its marker is flagged by
// a failover, not if it is gone). Called with c.mu held.
func (s *Store) rememberAsyncEpoch(c *counts) {
	key := c.req.Key
	if c.epoch == "" {
		return
	}
	exp := c.epochAt + int64(epochTTL(&c.req))
	if _, ok := s.aseen.Load(key); !ok && s.aseenN.Load() >= s.maxKeys {
		return
	}
	if _, loaded := s.aseen.LoadAndStore(key, asyncSeen{id: c.epoch, exp: exp}); !loaded {
		s.aseenN.Add(1)
	}
}

// pruneAsyncSeen forgets the remembered ids whose state no longer
// matters.
func (s *Store) pruneAsyncSeen(now int64) {
	s.aseen.Range(func(key string, m asyncSeen) bool {
		if m.exp <= now {
			if _, ok := s.aseen.LoadAndDelete(key); ok {
				s.aseenN.Add(-1)
			}
		}
		return true
	})
}

// asyncCallFailed makes the epochs of cs's keys due: a call to this
// region's store failed, which may have restarted.
func (s *Store) asyncCallFailed(cs []*counts) {
	for _, c := range cs {
		if c != nil {
			c.mu.Lock()
			c.epochStale = true
			c.mu.Unlock()
		}
	}
}
