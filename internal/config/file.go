package config

import (
	"time"

	"github.com/sluice-io/sluice/internal/console"
	"github.com/sluice-io/sluice/internal/envoyrls"
	"github.com/sluice-io/sluice/internal/gateway"
	"github.com/sluice-io/sluice/internal/rlqs"
)

// File is the YAML document as written, before defaults and validation.
// Decoding is strict: a key that no field here names is an error.
//
// # Extension seam
//
// Components that plug into `sluice serve` (the Envoy rate limit service in
// internal/envoyrls, the AI gateway in internal/gateway) add their own
// section here with one field, for example:
//
//	Envoy *envoyrls.Config `yaml:"envoy"`
//
// The section's type is decoded strictly like the rest. If it (or its
// pointer) has a `Validate() error` method, Load calls it after the built-in
// checks and reports its error with the file and the line of the section.
// The compiled Config keeps the File it came from in Config.File, so the
// component reads its section from there after each reload.
type File struct {
	// Listen is the HTTP API's address, such as ":8080".
	Listen string `yaml:"listen"`
	// AdminToken guards POST /v1/reset. The environment variable
	// SLUICE_ADMIN_TOKEN, when set, takes precedence.
	AdminToken string `yaml:"admin_token"`
	// AdminTokens are the operators' admin tokens, each named and known by
	// its SHA-256 (admin.go).
	AdminTokens []AdminTokenSection `yaml:"admin_tokens"`
	// AllowedHosts are the names, beyond the defaults, by which a browser
	// may reach the service (the server's hostcheck.go).
	AllowedHosts []string `yaml:"allowed_hosts"`
	// MaxBodyBytes bounds a request body; default 64 KiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxChecks bounds the checks of one batch; default 16.
	MaxChecks int `yaml:"max_checks"`
	// ShutdownTimeout bounds the drain of in-flight requests; default 10s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// MaxWaiting bounds the requests this instance holds at once for
	// delay-mode policies; past it they are answered at once (admitted
	// within the burst, 429 beyond). Default DefaultMaxWaiting.
	MaxWaiting int `yaml:"max_waiting"`
	// Store selects where limiter state lives.
	Store StoreSection `yaml:"store"`
	// Policies are the named limits.
	Policies map[string]PolicySection `yaml:"policies"`
	// Tiers are plans: bundles of policies.
	Tiers map[string]TierSection `yaml:"tiers"`
	// Keys maps API keys, by SHA-256 hash, to tiers.
	Keys []KeySection `yaml:"keys"`
	// Overrides give single identities their own limit for a policy.
	Overrides []OverrideSection `yaml:"overrides"`
	// Authz configures the forward-auth endpoint.
	Authz AuthzSection `yaml:"authz"`
	// Envoy runs the Envoy rate limit service (gRPC RLS v3) beside the API,
	// configured by envoyproxy/ratelimit's YAML files.
	Envoy *envoyrls.Config `yaml:"envoy"`
	// RLQS serves Envoy's quota protocol (rate_limit_quota filter) on the
	// Envoy section's gRPC port; it needs that section.
	RLQS *rlqs.Config `yaml:"rlqs"`
	// Gateway runs the AI gateway (OpenAI-compatible proxy with token
	// limits) on its own listener beside the API, with the service's store.
	Gateway *gateway.Config `yaml:"gateway"`
	// Console serves the operator's console at /ui when enabled.
	Console *console.Config `yaml:"console"`
}

// StoreSection is the `store:` section.
type StoreSection struct {
	// URL is "memory" (the default) or a redis:// or rediss:// URL.
	URL string `yaml:"url"`
	// URLEnv names an environment variable holding the URL (for a
	// Kubernetes Secret, say); when set it replaces URL and must not be
	// empty.
	URLEnv string `yaml:"url_env"`
	// FailurePolicy says what a decision is when the store cannot be
	// reached: local (the default), fail_open, fail_closed or error. The
	// bound each keeps is in docs/redis.md.
	FailurePolicy string `yaml:"failure_policy"`
	// Timeout bounds one store call; default 50ms.
	Timeout time.Duration `yaml:"timeout"`
	// Instances, when set, is the number of sluice instances sharing the
	// limits, for the local policy's share (limit ÷ instances); 0 (the
	// default) counts them by heartbeat in the store; until a heartbeat
	// has read the count, the local policy denies (docs/redis.md).
	Instances int `yaml:"instances"`
	// LocalCache lets the Redis store answer denials it already knows
	// locally, until their RetryAfter; on unless set to false, as in the
	// library (redisstore.Options.DisableDenyCache).
	LocalCache bool `yaml:"local_cache"`
	// Lease is the default of every policy's `lease`: decide hot keys
	// locally from capacity taken from Redis in chunks (package lease).
	Lease bool `yaml:"lease"`
	// MaxKeys bounds the keys held in memory; 0 means the store's default.
	MaxKeys int `yaml:"max_keys"`
	// MaxBytes bounds the heap the memory store's keys and their state
	// take, as it accounts them (memstore.Options.MaxBytes), and so the
	// local failure policy's store with Redis; 0 means its
	// default, 64 MiB. At least MinStoreMaxBytes.
	MaxBytes int64 `yaml:"max_bytes"`
	// PlainWindows keeps Redis fixed-window counts in per-window keys and
	// decides most cost-1 checks by one plain command (SET NX PX for a new
	// window key, else INCRBY) instead of a script
	// (redisstore.Options.PlainWindows): under half the Redis CPU. On by
	// default: no door of serve refunds a fixed window, so it admits what
	// the scripts' layout admits (but for a limit raised mid-window, which
	// admits in that window up to as many fewer as the plain path denied
	// before: stricter, never looser; docs/redis.md). A fleet
	// whose instances run with and without it (a rolling upgrade from a
	// version where it was off) counts in both layouts while mixed: up to
	// 2x a fixed window's limit per window, until the last instance of the
	// old layout stops. Set it to false to keep the old layout.
	// Restart-only.
	PlainWindows bool `yaml:"plain_windows"`
	// Region names the region this instance runs in. With Regions, it lets
	// policies with `scope: global` hold one limit across regions, each
	// region on its own Redis (URL is this region's; docs/regions.md).
	// Restart-only.
	Region string `yaml:"region"`
	// Regions are the other regions' stores, by region name: reached only
	// to fetch and refund shares of the global keys whose home they are.
	// Restart-only.
	Regions map[string]RegionSection `yaml:"regions"`
	// Global tunes the shares of global policies. Restart-only.
	Global GlobalSection `yaml:"global"`
	// GlobalPolicies is compiled from the policies with `scope: global`:
	// policy name to home region, "" for a home chosen by a hash of the
	// key. It is not read from the file. Restart-only: the store is
	// opened with the policies' scopes at start.
	GlobalPolicies map[string]string `yaml:"-"`
	// AsyncPolicies is compiled from the global policies with `mode:
	// async`. It is not read from the file. Restart-only.
	AsyncPolicies map[string]bool `yaml:"-"`
}

// RegionSection is one entry of `store.regions:`.
type RegionSection struct {
	// URL is the region's Redis, a redis:// (or rediss://, cluster or
	// sentinel) URL as store.url takes.
	URL string `yaml:"url"`
	// URLEnv names an environment variable holding the URL.
	URLEnv string `yaml:"url_env"`
}

// GlobalSection is `store.global:`, the tuning of global policies' shares
// (region.Options); every field has a default.
type GlobalSection struct {
	// FailurePolicy answers a global key in a region that holds no share
	// and cannot reach the key's home: fail_closed (the default: the
	// bound holds) or fail_open.
	FailurePolicy string `yaml:"failure_policy"`
	// Horizon is how much of the recent demand a share fetch covers
	// (at least three fetch round trips); default 250ms.
	Horizon time.Duration `yaml:"horizon"`
	// TTL is how long a GCRA or token-bucket share may be spent before
	// its rest is refunded at home; default 5s.
	TTL time.Duration `yaml:"ttl"`
	// FetchTimeout bounds a fetch or refund across regions; default 2s.
	FetchTimeout time.Duration `yaml:"fetch_timeout"`
	// ClockSkew, when set, is the most the regions' clocks differ by:
	// window shares are then spent to their window's end by the local
	// clock less it. Unset trusts no clock (a share ends up to a round
	// trip early).
	ClockSkew time.Duration `yaml:"clock_skew"`
	// SyncInterval is how often an instance delivers the counts of
	// policies with `mode: async` to the other regions; default 100ms.
	SyncInterval time.Duration `yaml:"sync_interval"`
	// StaleAfter is how old a count of an async policy may grow
	// undelivered (a partition) before the region answers the policy by
	// failure_policy: the longest delay of the async bound; default 1s,
	// at least sync_interval plus two round trips to the farthest region.
	StaleAfter time.Duration `yaml:"stale_after"`
	// TrustHistory, when true, trusts a store that kept a global key's
	// epoch marker across a restart from its files or a failover: no
	// quarantine for a change of its replication id, only for a lost
	// marker (region.Options.TrustHistory). For a home that persists
	// every write (appendfsync always) and fails over only to replicas
	// in sync (min-replicas-to-write, WAIT); otherwise a failover to a
	// lagging replica exceeds the limit by what it missed. Default false.
	TrustHistory bool `yaml:"trust_history"`
}

// PolicySection is one entry of `policies:`.
type PolicySection struct {
	// Algorithm is one of sluice's algorithm names; default gcra.
	Algorithm string `yaml:"algorithm"`
	// Limit is a limit as sluice.ParseLimit reads it, such as "10/min".
	Limit string `yaml:"limit"`
	// Burst, when set, overrides the burst in Limit.
	Burst int64 `yaml:"burst"`
	// Shadow counts what the policy would deny but never denies.
	Shadow bool `yaml:"shadow"`
	// Lease decides the policy's hot keys from leased capacity on Redis;
	// store.lease when unset. Not for sliding_window_log.
	Lease *bool `yaml:"lease"`
	// MaxWait turns on delay mode: a request that would be admitted within
	// it is charged now and answered after its delay, instead of 429. Only
	// gcra and token_bucket; at most MaxMaxWait.
	MaxWait time.Duration `yaml:"max_wait"`
	// Delay is NGINX's limit_req delay, the policy's burst NGINX's burst:
	// of burst+1 requests, the first Delay+1 pass at once and the rest are
	// held, paced at the rate.
	Delay *int64 `yaml:"delay"`
	// NGINX is the policy in NGINX's own words, instead of limit, burst,
	// algorithm, max_wait and delay (nginx.go).
	NGINX *NGINXSection `yaml:"nginx"`
	// Scope is regional (the default: each region its own limit) or
	// global (one limit across the regions of store.regions, decided in
	// each region from shares charged at the key's home; gcra,
	// token_bucket and fixed_window). Restart-only.
	Scope string `yaml:"scope"`
	// Home is a global policy's home region, whose store is the
	// authority for its keys; unset spreads keys over the regions by a
	// hash of the key.
	Home string `yaml:"home"`
	// Mode is a global policy's: exact (the default: every admission
	// backed by a charge at the key's home, ≤ the limit + 1) or async
	// (each region decides on its own store, and the regions' counts are
	// shared every store.global.sync_interval: the limit is used in
	// full, and exceeded by at most what the regions admit in a sync
	// interval plus a round trip; docs/regions.md). Restart-only.
	Mode string `yaml:"mode"`
	// Timezone makes a limit per day, week, month or year a calendar
	// window in this IANA zone, such as "Europe/Berlin": "5000/day" then
	// resets at local midnight, 23 or 25 hours apart across DST changes.
	// The same as writing "5000/day in Europe/Berlin". The algorithm
	// defaults to (and must be) fixed_window.
	Timezone string `yaml:"timezone"`
	// ResetAt is the local time, "HH:MM", at which calendar windows start;
	// default 00:00. UTC when no timezone is given.
	ResetAt string `yaml:"reset_at"`
	// WeekStarts is the first day of calendar weeks, such as "sunday";
	// default monday.
	WeekStarts string `yaml:"week_starts"`
}

// TierSection is one entry of `tiers:`.
type TierSection struct {
	// Policies are the names of the policies the tier applies, all at once.
	Policies []string `yaml:"policies"`
}

// KeySection is one entry of `keys:`.
type KeySection struct {
	// Name describes the key in logs; never the key itself.
	Name string `yaml:"name"`
	// Hash is the lowercase hex SHA-256 of the API key (`sluice keys hash`).
	Hash string `yaml:"hash"`
	// Tier is the tier the key belongs to.
	Tier string `yaml:"tier"`
	// Overrides replace the limits of some of the tier's policies for this
	// key: policy name to limit, such as {pro: "500/min"}.
	Overrides map[string]string `yaml:"overrides"`
}

// OverrideSection is one entry of `overrides:`.
type OverrideSection struct {
	// Key is the identity as the service derives it, such as "user:42",
	// "ip:203.0.113.7", or the key of a /v1/check call.
	Key string `yaml:"key"`
	// Policy is the policy whose limit is replaced.
	Policy string `yaml:"policy"`
	// Limit is the limit for this key, such as "50/min".
	Limit string `yaml:"limit"`
}

// AuthzSection is the `authz:` section for the forward-auth endpoint.
type AuthzSection struct {
	// APIKeyHeaders are tried in order for an API key. For Authorization,
	// a "Bearer " prefix is removed. Default: [X-API-Key, Authorization].
	APIKeyHeaders []string `yaml:"api_key_headers"`
	// UserHeader carries a user id set by an authenticating proxy. It is
	// believed only from a peer in TrustedProxies, which it requires.
	UserHeader string `yaml:"user_header"`
	// TrustedProxies are the CIDRs whose X-Forwarded-For and UserHeader are
	// believed.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// DefaultTier applies to requests without an API key, keyed by user id
	// or client IP.
	DefaultTier string `yaml:"default_tier"`
	// UnknownKeys says what an API key that is not in `keys:` gets:
	// reject (401) or default_tier (the default tier, keyed by its hash;
	// each invented key gets a limit of its own, so use it only where the
	// upstream checks keys).
	UnknownKeys string `yaml:"unknown_keys"`
	// DenyStatus is the status of a denial: 429 (default), or 403 for
	// NGINX auth_request, which passes on only 401 and 403.
	DenyStatus int `yaml:"deny_status"`
	// Routes add policies to the caller's tier for the original requests
	// they match, by the URI, method and host the proxy forwards.
	Routes []RouteSection `yaml:"routes"`
	// SelectablePolicies are the policies a request may add on top of the
	// caller's tier with ?policy=NAME. A request can name no other.
	SelectablePolicies []string `yaml:"selectable_policies"`
	// IPv6Prefix is the length of the IPv6 block that counts as one client
	// when callers are keyed by address: 64 (default, what one subscriber
	// or one mobile device usually holds) to 32. A client that holds a
	// /48 (a tunnel broker's, free) is 65,536 clients at /64 and one at
	// /48; a mobile carrier puts many devices in one /48.
	IPv6Prefix int `yaml:"ipv6_prefix"`
}

// RouteSection is one entry of `authz.routes`: when the original request
// matches every matcher given, the route's policies are charged on top of
// the caller's tier.
type RouteSection struct {
	// Path matches the original path exactly, after normalization
	// (config.NormalizePath: case, "//", "." and "..", escapes).
	Path string `yaml:"path"`
	// PathPrefix matches the start of the normalized original path.
	PathPrefix string `yaml:"path_prefix"`
	// Methods match the original method, in any case.
	Methods []string `yaml:"methods"`
	// Host matches the original host, in any case, without port.
	Host string `yaml:"host"`
	// Policies are added to the caller's tier.
	Policies []string `yaml:"policies"`
}
