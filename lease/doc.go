// Package lease decides hot keys locally, from capacity taken from a shared
// store in chunks, without ever admitting more than the limit fleet-wide.
//
// # Design
//
// A Store wraps a sluice.Store (Redis, usually). For a hot key, it takes a
// chunk of the key's capacity with one OpAllow of the chunk's size: the
// store charges the whole chunk at once, atomically, as if that many
// requests had arrived. The instance then admits requests from the chunk
// locally, with no round trip, and fetches the next chunk in the background
// when half of the current one is used, so that a steady caller never
// waits. Every admission is thus backed by a charge the store already made:
// the fleet admits at most what the store's limit admits (ideal + 1), with
// any number of instances, whatever their clocks.
//
// Capacity the instance no longer needs goes back with OpRefund: capacity
// of a key unused for IdleAfter, capacity older than TTL, and everything on
// Close. Refunds apply to GCRA and the token bucket only, whose refunds do
// not depend on when they arrive: a refund adds capacity that was charged
// and not used, and is capped at a full bucket. Window algorithms do not
// refund (see below).
//
// The chunk adapts to the instance's recent rate on the key and to the
// instance's learnt share of the key's traffic (what the store's Remaining
// says the others took between two fetches), and is bounded by MaxFraction
// of the capacity times that share, so that the capacity held across the
// fleet stays a small part of the burst. The rate is covered for a horizon
// that depends on how close the key is to its limit: Horizon (50ms) when
// the store had nothing left at the last fetch (or direct decision),
// growing with the square of the fraction left to MaxHorizon (1s) when it
// was full. A hot key far from
// its limit thus costs the store about two fetches a second per instance,
// and one at its limit holds little capacity that others could use. The
// next chunk is fetched when what is held falls under half a chunk or
// under four fetch times of the rate (fetch latency is measured), so that
// a steady caller never waits for a fetch. A request that finds the lease
// empty and no fetch in flight is decided by the store, in its batch's one
// call, while the chunk is fetched in the background, when the key is far
// from its limit (chunk and cost at most a sixteenth of what the store had
// left); near it, it waits for the chunk. A GCRA or token-bucket lease
// in use that holds less than a chunk is topped up once it is half its TTL
// old. Unused capacity goes back after IdleAfter near the limit,
// and after up to IdleAfter × MaxHorizon/Horizon far from it (the idle
// allowance grows as the horizon does), and a pause of up to 64 rate
// windows keeps the key's measured rate: a client between bursts keeps
// its lease, and its next burst is not decided by the store, on its
// requests' path. Cold keys (a chunk would be
// under MinChunk) and small limits (the bound is under MinChunk) go
// straight to the store, as without leases.
//
// When the store denies a chunk, the instance takes what the store says is
// left if a whole chunk is more than 4 Horizons away (or the window ends
// first); otherwise, or when nothing is left, it denies the key locally
// until the store's RetryAfter for the chunk has passed, and asks again. Over its limit, a key thus costs the store one call per
// chunk, not one per request.
//
// When the store fails (an error, or a Degraded decision by its failure
// policy), the instance keeps answering from the capacity it holds, which
// was charged already; once that is used, requests go to the store and its
// failure policy answers them, as without leases. Leasing adds no
// over-admission of its own, whatever the policy.
//
// # Algorithms
//
// GCRA, TokenBucket, FixedWindow and SlidingWindowCounter are leased.
// SlidingWindowLog is not: its state is one timestamp per admitted unit, so
// a chunk would stamp all its units with the fetch time and then release
// them all at once a Period later, a burst the log exists to prevent.
// Concurrency is not: a slot is held by a named holder until released, and
// local slots could not be released by another instance or lapse when a
// holder crashes. Both always go to the store, and so do fixed windows
// with a Calendar (local days, weeks, months), whose window boundaries the
// chunk sizing does not compute.
//
// Window algorithms lease within one window: a chunk is used only until
// the end of the window it was charged in (estimated early: the time the
// fetch was sent plus the store's ResetAfter), since using it in the next
// window would admit it there on top of that window's limit. They never
// refund: a refund that reached the store after the window turned (a
// paused Redis runs queued commands late) would free capacity in the next
// window. The unused part of a window chunk is stranded until the window
// ends; Stats.Stranded counts it.
//
// # Clocks
//
// A decision from a GCRA or token-bucket lease reads a clock.Coarse (one
// atomic load; reading the system clock was 23% of a leased decision),
// and everything else reads the system clock it caches (Coarse.Source):
// window decisions, fetch times, the sweep, settlement. A Coarse never runs
// ahead of its source and never goes back; it lags by up to a period (1ms)
// plus however late a starved CPU runs its refresher, Λ. What a lagging
// reading changes, for a GCRA or token-bucket lease:
//   - Admission needs tokens the store already charged: a lag admits
//     nothing that was not charged, so the fleet-wide bound (ideal + 1)
//     does not depend on the clock at all.
//   - The local denial after a denied fetch (until the store's
//     RetryAfter), the backoff after a failed one, and RetryAfter and
//     ResetAfter of local decisions end up to Λ later: stricter.
//   - The rate, idleness and prefetch marks are measured up to Λ off: a
//     chunk sized a little differently (still within MaxFraction), a lease
//     refunded up to Λ early.
//   - The one reading that a lag makes laxer: a chunk may be spent up to
//     Λ past its TTL (counted exactly from the fetch's send). TTL only
//     keeps a chunk from being spent long after its charge, when the limit
//     has refilled under it; the charge itself bounds what it admits. So
//     on the wall clock the TTL is TTL + Λ, a few ms on 3 s.
//
// A window chunk is different: it must not be spent past the end of the
// window it was charged in, or it would be admitted in the next window on
// top of that window's limit. Its end is computed early (the fetch's send
// time plus the store's ResetAfter), but the margin is Redis's processing
// time, which may be shorter than Λ; and Λ itself has no bound a decision
// could check without reading the exact clock. So window decisions read
// the exact clock (TestWindowChunkReadsExactClock). With Options.Clock
// set, every reading comes from that clock.
//
// # Decisions under a lease
//
// Decisions made locally have Source sluice.FromLease. Allowed is exact for
// the fleet-wide bound. Remaining is the capacity this instance holds plus
// what the store reported left after its last fetch (other instances may
// have taken that since). RetryAfter of a local denial is when this
// instance will next ask the store for the key (the store's exact wait for
// a chunk); a retry then may still be denied if other instances took the
// capacity first. ResetAfter is the store's, counted down from the last
// fetch. Decisions the store made pass through unchanged.
//
// # Differences from a plain store
//
// The storetest conformance suite runs against a leased Store twice: with
// the defaults, where its small limits go straight to the store, and with
// a Store that leases all it can (chunks of up to half the burst, sized
// for an hour of the rate, from one unit), where every scenario passes
// but these, which pin a plain store's answers
// (TestConformanceAggressiveLease lists them):
//   - ResetAfter of a decision the store makes counts the capacity held
//     in leases as used (RefillAfterIdle: 200ms, not 100ms).
//   - Over a long run, capacity held in leases at the end is
//     under-admission (SimulatedDay, GCRA and token bucket: 2412 of an
//     ideal 2420 with chunks of half the burst; the default MaxFraction
//     holds a tenth).
//
// The leased-specific answers differ in: Remaining (above), RetryAfter of
// local denials (above), refunds and charges (Apply passes them to the
// store; they do not touch the local chunk: SettleLocal settles them into
// it, settle.go), OpPeek (answered from the chunk when it
// holds the cost, else by the store, which does not know the chunk), and
// OpReset (drops the local chunk without refunding it). A request with a
// MaxWait (a reservation) goes to the store, as does any batch holding
// one. Refill is not lost in the store while a chunk is held, but a
// bucket that is full at a different moment than it would be without
// leases loses refill at a different moment: totals compare exactly only
// while the bucket is not full (TestLeasedTierRedis in internal/gateway).
//
// The bound on admissions is the store's: ideal + 1, tested on Redis with
// three instances, uniform and skewed traffic and a paused Redis
// (TestFleetNeverOverAdmits, TestFleetRedisPaused), and deterministically
// on a fake clock per algorithm (TestAccuracyTable: ≥ 99% of ideal with
// traffic spread evenly over three instances, ≥ 97% when one takes 90%;
// measured 99.5-100%). A fetch that misses the wrapped store's deadline
// keeps its chunk: it waits for its reply up to TTL (sluice.WaitForReply),
// its takers at most FetchWait, and the chunk is credited when the reply
// comes (TestLateFetchKeepsItsChunk).
package lease
