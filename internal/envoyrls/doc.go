// Package envoyrls makes sluice a drop-in replacement for
// envoyproxy/ratelimit: it serves Envoy's rate-limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC,
// and the /json HTTP endpoint), configured by envoyproxy/ratelimit's YAML
// files unchanged.
//
// # Compatibility
//
// The loader accepts and rejects what envoyproxy/ratelimit's does: domain,
// nested descriptors with key and value, wildcard values ("foo*", also
// "a*b"), rate_limit with unit, requests_per_unit, unlimited, name and
// replaces, and shadow_mode, quota_mode, metadata, detailed_metric,
// value_to_metric and share_threshold; unknown or misspelled keys, repeated descriptor keys or
// domains, a bad unit, an empty domain or key, unlimited with a unit and
// replaces naming itself are errors that name the file. Lookup is the same
// too: at each level key_value, then wildcards in file order, then the
// key alone; a limit applies only at the level of the request's last entry.
//
// By default a limit is a fixed window of its unit aligned to the Unix
// epoch, so answers, remaining counts and reset durations are those of
// envoyproxy/ratelimit. The extension key rate_limit.algorithm (gcra,
// token_bucket, sliding_window, sliding_window_log, fixed_window) picks
// another algorithm, and rate_limit.burst a burst for gcra and token_bucket.
//
// # Beyond envoyproxy/ratelimit
//
// All descriptors of a request are charged in one Store.ApplyAll: one
// round trip to Redis, and all or nothing, so a request denied by one limit
// charges none of the others (envoyproxy/ratelimit charges them anyway).
// Shadow-mode limits report OK and never block the others. Quota-mode
// limits (quota_mode) report OVER_LIMIT when over, but the request is over
// only when every quota-mode descriptor of it is (or another limit is), as
// envoyproxy/ratelimit decides; the descriptors over their quota are then
// not charged. A rule's metadata goes back in the response's dynamic
// metadata when Options.ResponseDynamicMetadata is set. hits_addend is
// honoured per request and per descriptor; a descriptor hits_addend of 0
// checks without charging. A request descriptor's own limit overrides the
// configuration. The time is the store's: Redis TIME, not the host clock.
package envoyrls
