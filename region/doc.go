// Package region holds one limit across regions, each region on its own
// store (Redis, Sentinel or Cluster), with every decision made in the
// region that receives the request.
//
// # Design
//
// A global key has a home region, whose store is the key's authority: it
// keeps the key's ordinary state. In the home region a global key is
// decided by the region's store, as any key. Any other region decides it
// from a share: units of the key's capacity that the home store already
// charged (one OpAllow of n units, as if n requests had arrived), credited
// to a hash in the region's own Redis and spent there by one Lua script,
// so that all of the region's instances draw on one share atomically and
// no decision leaves the region. Every admission anywhere is thus backed
// by a charge the home store made first: all regions together admit at
// most what the home admits (ideal + 1 for GCRA and the token bucket from
// a key's first request; its limit per window for fixed windows).
//
// Shares are fetched in the background by each instance, sized by its
// demand (a moving average) over Horizon, at least three fetch round
// trips, at most MaxFraction of the capacity; the next fetch is sent when
// the share falls under half a fetch or two round trips of the demand. A
// request that finds the share spent waits for the fetch in flight, up to
// FetchWait, unless the home came back short (it is at its limit). Shares
// expire by the region's Redis clock read before their fetch was sent. A
// bucket share is spent for TTL from then, and what is left of it, or of
// a share unspent for IdleAfter, is taken back atomically and refunded at
// home. A window's share ends with the window it was charged in,
// estimated early (ClockSkew), and is never refunded.
//
// A global key may instead be asynchronous (Options.Async): decided on
// each region's store alone, the units each instance admitted delivered
// to the other regions' stores every SyncInterval, and answered by Policy
// while a count of it is StaleAfter old undelivered (async.go). It uses
// all of the limit, and exceeds it by what the regions admit within the
// delivery delay.
//
// A region cut off from a home spends what it holds, then its Policy
// answers (FailClosed keeps the bound). The bounds, the failure table and
// a deployment guide are in docs/regions.md.
package region
