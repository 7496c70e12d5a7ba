package gateway

// The windows of a batch's budget hold
//
// A batch's budget reservation is settled when the batch ends, hours
// after it was charged and possibly after its budgets' windows turned (a
// day's at midnight, a month's at its end). Its refund names the window
// its charge was taken from, as a request's does (admit.go's noteWindows,
// Request.ReservedAhead): the hold records, for each fixed-window budget,
// when the window of its charge ends (the charge's Decision.ResetAfter
// from the instant it came back), and the settlement's refund carries the
// time left until then. The store (memstore, redisstore, a region's share
// of a global budget) gives the refund back only to that window and drops
// it once the window has ended: a hold from yesterday settled today never
// frees today's money.
//
// The ends ride in the provider's metadata with the rest of the hold, in
// the sluice_cost value after the amount ("40000 1a2b3c4d:lz3k9a0x ..."):
// each budget named by a short hash of its store key (never the key), its
// window's end in Unix milliseconds, base 36. A hold from before the ends
// were recorded, or a budget the configuration added since, names no
// window: its refund goes to the current window on one store, as before,
// and is dropped outside a global budget's home.

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/region"
)

// Bounds of a hold's window ends: the provider's metadata values are at
// most 512 characters (OpenAI's bound), and a request has at most three
// levels of maxBudgetsPerLevel budgets, 24 ends of at most 19 characters
// and the amount: 476. The encoder stops before the bound all the same
// (the ends left out name no window).
const (
	maxMetadataValue = 512
	maxHoldEnds      = 3 * maxBudgetsPerLevel
)

// windowTag names a budget's store key in a hold's metadata.
func windowTag(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:4])
}

// noteHoldWindows records in h, for each fixed-window budget of reqs
// admitted by ds at now, when the window of its charge ends.
func noteHoldWindows(h *hold, reqs []sluice.Request, ds []sluice.Decision, now time.Time) {
	for i := range reqs {
		if i >= len(ds) || reqs[i].Algorithm != sluice.FixedWindow || ds[i].ResetAfter <= 0 {
			continue
		}
		if h.ends == nil {
			h.ends = map[string]int64{}
		}
		h.ends[windowTag(reqs[i].Key)] = now.Add(ds[i].ResetAfter).UnixMilli()
	}
}

// costValue is the sluice_cost metadata value: the amount, then the
// window ends.
func (h hold) costValue() string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(h.cost, 10))
	for _, tag := range sortedKeys(h.ends) {
		e := " " + tag + ":" + strconv.FormatInt(h.ends[tag], 36)
		if b.Len()+len(e) > maxMetadataValue {
			break
		}
		b.WriteString(e)
	}
	return b.String()
}

// parseCost reads a sluice_cost metadata value into h.
func (h *hold) parseCost(v string) error {
	amount, rest, _ := strings.Cut(v, " ")
	c, err := strconv.ParseInt(amount, 10, 64)
	if err != nil {
		return err
	}
	h.cost = c
	for n, f := range strings.Fields(rest) {
		if n >= maxHoldEnds {
			break
		}
		tag, end, ok := strings.Cut(f, ":")
		ms, err := strconv.ParseInt(end, 36, 64)
		if !ok || err != nil || len(tag) != 8 || ms <= 0 {
			continue // names no window
		}
		if h.ends == nil {
			h.ends = map[string]int64{}
		}
		h.ends[tag] = ms
	}
	return nil
}

// reservedAhead is the ReservedAhead of a refund of h's charge on the
// budget q at now: the time left until the window of its charge ends, or
// zero when h names no window for q. ended reports that the window has
// ended by now: the refund is not sent at all. (A store reads a refund's
// ReservedAhead as the end nearest to now + ReservedAhead: 1ns, as a
// request's late refund sends, would name the current window once more
// than half of it has passed, and a batch settles up to a day later.)
func (h hold) reservedAhead(q *sluice.Request, now time.Time) (ahead time.Duration, ended bool) {
	if q.Algorithm != sluice.FixedWindow {
		return 0, false
	}
	end, ok := h.ends[windowTag(q.Key)]
	if !ok {
		return 0, false
	}
	left := time.UnixMilli(end).Sub(now)
	if left <= 0 {
		return 0, true
	}
	return min(left, maxBatchAhead), false
}

// maxBatchAhead bounds a refund's ReservedAhead: a year's window, the
// longest a budget has (sluice bounds it at 16 years).
const maxBatchAhead = 366 * 24 * time.Hour

// regionLayer is st's region.Store, found through the stores' Unwrap
// methods, or nil.
func regionLayer(st sluice.Store) *region.Store {
	for st != nil {
		if r, ok := st.(*region.Store); ok {
			return r
		}
		u, ok := st.(interface{ Unwrap() sluice.Store })
		if !ok {
			return nil
		}
		st = u.Unwrap()
	}
	return nil
}
