// Package config loads and validates the sluice service's YAML file: the
// store, named policies, tiers of policies, API keys (as SHA-256 hashes)
// with per-key overrides, and the forward-auth settings.
//
// Loading is strict and takes three steps, as Prometheus does: decode with
// unknown fields rejected, apply defaults, validate. Every error names the
// file, the line and the field, and lists the valid choices where there are
// any. The result is an immutable *Config that the server swaps atomically
// on reload.
package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
	"github.com/sluice-io/sluice/internal/yamlconf"
	"github.com/sluice-io/sluice/lease"
)

// ErrInvalid means a configuration file is malformed. Load's errors wrap it.
var ErrInvalid = errors.New("config: invalid configuration")

// Defaults applied to fields left empty.
const (
	DefaultListen          = ":8080"
	DefaultMaxBodyBytes    = 64 << 10
	DefaultMaxChecks       = 16
	DefaultShutdownTimeout = 10 * time.Second
	DefaultStoreTimeout    = 50 * time.Millisecond
	// MaxFileBytes bounds the configuration file itself.
	MaxFileBytes = yamlconf.MaxFileBytes
	// MaxKeyLen bounds an identity, the key of a check.
	MaxKeyLen = 512
	// MinStoreMaxBytes is the least store.max_bytes (TestBadConfigs).
	MinStoreMaxBytes = 1 << 20
)

// Failure policies of the store section.
const (
	FailOpen   = "fail_open"
	FailClosed = "fail_closed"
	FailLocal  = "local"
	FailError  = "error"
)

var (
	failurePolicies = []string{FailLocal, FailOpen, FailClosed, FailError}
	nameRE          = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	hashRE          = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Config is a validated configuration. It is immutable once loaded.
type Config struct {
	// Path is the file it was loaded from.
	Path string
	// File is the document as decoded, with defaults applied. Extension
	// sections (see File) are read from here.
	File *File
	// Listen is the HTTP API's address.
	Listen string
	// AdminToken guards POST /v1/reset; empty disables it.
	AdminToken string
	// AdminTokens are the admin tokens by name: admin_token's (named
	// LegacyAdminTokenName) and admin_tokens'. None disables the admin
	// endpoints. See admin.go.
	AdminTokens []AdminToken
	// AllowedHosts are allowed_hosts, normalized (see admin.go): the
	// names a browser may reach the service by, beside the defaults.
	AllowedHosts []string
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes int64
	// MaxChecks bounds the checks of one batch.
	MaxChecks int
	// MaxWaiting bounds the requests held at once for delay-mode policies.
	MaxWaiting int
	// ShutdownTimeout bounds the drain on shutdown.
	ShutdownTimeout time.Duration
	// Store is the store section with defaults applied.
	Store StoreSection
	// Policies by name.
	Policies map[string]*Policy
	// Tiers by name.
	Tiers map[string]*Tier
	// Keys by SHA-256 hash.
	Keys map[string]*Key
	// Overrides by identity, then policy name.
	Overrides map[string]map[string]sluice.Limit
	// Authz is the forward-auth configuration.
	Authz Authz
}

// Policy is a named limit.
type Policy struct {
	// Name is the policy's name, used in metrics and store keys.
	Name string
	// Algorithm enforces the limit.
	Algorithm sluice.Algorithm
	// Limit is the limit.
	Limit sluice.Limit
	// Shadow counts denials without enforcing them.
	Shadow bool
	// Lease lets a Redis store decide the policy's hot keys locally from
	// leased capacity (sluice.Request.UseLease).
	Lease bool
	// MaxWait is the policy's max_wait: zero unless it is in delay mode
	// (see Reservation).
	MaxWait time.Duration
	// Delay is the policy's delay threshold, when HasDelay.
	Delay int64
	// HasDelay reports that the policy set delay.
	HasDelay bool
	// Global reports `scope: global`: one limit across regions.
	Global bool
	// Home is a global policy's home region; empty hashes the key.
	Home string
	// Async reports a global policy's `mode: async`: decided on each
	// region's store, counts shared at an interval.
	Async bool
}

// Tier is a plan: policies applied together, all or nothing.
type Tier struct {
	// Name is the tier's name.
	Name string
	// Policies are applied together.
	Policies []*Policy
}

// Key is an API key, known by its hash.
type Key struct {
	// Name describes the key.
	Name string
	// Hash is sluice.HashKey of the key.
	Hash string
	// Tier is the key's tier.
	Tier *Tier
	// Overrides replace policy limits for this key, by policy name.
	Overrides map[string]sluice.Limit
}

// Load reads, decodes and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := yamlconf.ReadFile(ErrInvalid, path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes and validates data; name is the file name used in errors.
// All problems found are reported together, one per line: unknown fields,
// wrongly typed values and bad values or references alike. The error is a
// *yamlconf.Error wrapping ErrInvalid.
func Parse(name string, data []byte) (*Config, error) {
	// Defaults that a zero value cannot express are set before decoding,
	// which keeps every field the document leaves out.
	file := File{Store: StoreSection{LocalCache: true, PlainWindows: true}}
	doc, err := yamlconf.Decode(ErrInvalid, name, data, &file)
	if err != nil {
		return nil, err
	}
	v := &validator{doc}
	cfg := v.compile(&file)
	if err := doc.Err(); err != nil {
		return nil, err
	}
	cfg.Path = name
	return cfg, nil
}

// validator collects errors, each located in the file.
type validator struct {
	doc *yamlconf.Doc
}

// addf records an error at the field named by path, such as
// "policies.free.limit" or "keys[2].tier".
func (v *validator) addf(path string, format string, args ...any) {
	v.doc.Addf(path, format, args...)
}

// MinAdminTokenLen is the shortest admin token taken: a token that can be
// guessed opens overrides, resets and the console's changes.
const MinAdminTokenLen = 16

// IsKeyHash reports whether h has the form of a key's hash as keys are
// configured: the lowercase hex SHA-256 of sluice.HashKey.
func IsKeyHash(h string) bool { return hashRE.MatchString(h) }

// compile applies defaults and validates, recording errors in v.
func (v *validator) compile(f *File) *Config {
	cfg := &Config{
		File:            f,
		Listen:          f.Listen,
		AdminToken:      f.AdminToken,
		MaxBodyBytes:    f.MaxBodyBytes,
		MaxChecks:       f.MaxChecks,
		MaxWaiting:      f.MaxWaiting,
		ShutdownTimeout: f.ShutdownTimeout,
		Store:           f.Store,
		Policies:        map[string]*Policy{},
		Tiers:           map[string]*Tier{},
		Keys:            map[string]*Key{},
		Overrides:       map[string]map[string]sluice.Limit{},
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	} else if cfg.MaxBodyBytes < 0 || cfg.MaxBodyBytes > 16<<20 {
		v.addf("max_body_bytes", "%d must be between 1 and %d", cfg.MaxBodyBytes, 16<<20)
	}
	if cfg.MaxChecks == 0 {
		cfg.MaxChecks = DefaultMaxChecks
	} else if cfg.MaxChecks < 0 || cfg.MaxChecks > 1000 {
		v.addf("max_checks", "%d must be between 1 and 1000", cfg.MaxChecks)
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	} else if cfg.ShutdownTimeout < 0 {
		v.addf("shutdown_timeout", "%s must be positive", cfg.ShutdownTimeout)
	}
	v.compileStore(&cfg.Store)
	v.compileRegions(&cfg.Store) // regions.go
	v.compileMaxWaiting(cfg)
	v.compileAdmin(f, cfg) // admin.go

	names := sortedKeys(f.Policies)
	for _, name := range names {
		p := f.Policies[name]
		path := "policies." + name
		if !nameRE.MatchString(name) {
			v.addf(path, "policy name must be 1-64 letters, digits, '_', '-' or '.'")
		}
		pol := &Policy{Name: name, Algorithm: sluice.GCRA, Shadow: p.Shadow}
		if p.Algorithm != "" {
			a, err := sluice.ParseAlgorithm(p.Algorithm)
			if err != nil {
				v.addf(path+".algorithm", "unknown algorithm %q; valid: %s", p.Algorithm, algorithmNames())
			} else if a == sluice.Concurrency {
				v.addf(path+".algorithm", "concurrency needs leases and is not served over HTTP; valid: %s", algorithmNames())
			} else {
				pol.Algorithm = a
			}
		}
		if p.NGINX != nil {
			v.compileNGINX(path, &p, pol) // nginx.go
		} else if p.Limit == "" {
			v.addf(path+".limit", "required, for example \"10/min\" or \"100/s burst 200\"")
		} else if l, err := sluice.ParseLimit(p.Limit); err != nil {
			v.addf(path+".limit", "%s", strings.TrimPrefix(err.Error(), "sluice: "))
		} else {
			pol.Limit = l
		}
		if p.Burst < 0 {
			v.addf(path+".burst", "%d must not be negative", p.Burst)
		} else if p.Burst > 0 && pol.Limit.Rate > 0 {
			pol.Limit.Burst = p.Burst
			if err := pol.Limit.Validate(); err != nil {
				v.addf(path+".burst", "%s", strings.TrimPrefix(err.Error(), "sluice: "))
			}
		}
		v.policyCalendar(path, &p, pol) // calendar.go
		if problem := algo.LogRateProblem(pol.Algorithm, pol.Limit); problem != "" {
			v.addf(path+".limit", "%s", problem)
		}
		pol.Lease = f.Store.Lease && lease.Leasable(pol.Algorithm)
		if p.Lease != nil {
			pol.Lease = *p.Lease
			if pol.Lease && !lease.Leasable(pol.Algorithm) {
				v.addf(path+".lease", "%s cannot be leased: its state is one entry per admitted event", pol.Algorithm)
			}
		}
		v.compileDelay(path, &p, pol)             // delay.go
		v.compileScope(path, &p, pol, &cfg.Store) // regions.go
		cfg.Policies[name] = pol
	}

	for _, name := range sortedKeys(f.Tiers) {
		t := f.Tiers[name]
		path := "tiers." + name
		if !nameRE.MatchString(name) {
			v.addf(path, "tier name must be 1-64 letters, digits, '_', '-' or '.'")
		}
		if len(t.Policies) == 0 {
			v.addf(path+".policies", "a tier needs at least one policy; %s", yamlconf.Valid("policies", names))
		}
		tier := &Tier{Name: name}
		seen := map[string]bool{}
		for i, pn := range t.Policies {
			p, ok := cfg.Policies[pn]
			switch {
			case !ok:
				v.addf(fmt.Sprintf("%s.policies[%d]", path, i), "unknown policy %q; %s", pn, yamlconf.Valid("policies", names))
			case seen[pn]:
				v.addf(fmt.Sprintf("%s.policies[%d]", path, i), "policy %q listed twice", pn)
			default:
				tier.Policies = append(tier.Policies, p)
			}
			seen[pn] = true
		}
		cfg.Tiers[name] = tier
	}
	tierNames := sortedKeys(f.Tiers)

	for i, k := range f.Keys {
		path := fmt.Sprintf("keys[%d]", i)
		hash := strings.ToLower(strings.TrimSpace(k.Hash))
		switch {
		case !hashRE.MatchString(hash):
			v.addf(path+".hash", "want the 64 hex digits of the key's SHA-256 (sluice keys hash KEY), never the key itself")
		case cfg.Keys[hash] != nil:
			v.addf(path+".hash", "same key as %q", cfg.Keys[hash].Name)
		}
		tier, ok := cfg.Tiers[k.Tier]
		if !ok {
			v.addf(path+".tier", "unknown tier %q; %s", k.Tier, yamlconf.Valid("tiers", tierNames))
		}
		key := &Key{Name: k.Name, Hash: hash, Tier: tier}
		if key.Name == "" {
			key.Name = "key-" + hash[:min(8, len(hash))]
		}
		for _, pn := range sortedKeys(k.Overrides) {
			opath := path + ".overrides." + pn
			if _, ok := cfg.Policies[pn]; !ok {
				v.addf(opath, "unknown policy %q; %s", pn, yamlconf.Valid("policies", names))
				continue
			}
			l, err := sluice.ParseLimit(k.Overrides[pn])
			if err != nil {
				v.addf(opath, "%s", strings.TrimPrefix(err.Error(), "sluice: "))
				continue
			}
			l, problem := FitOverride(cfg.Policies[pn], l)
			if problem != "" {
				v.addf(opath, "%s", problem)
				continue
			}
			if key.Overrides == nil {
				key.Overrides = map[string]sluice.Limit{}
			}
			key.Overrides[pn] = l
		}
		if hashRE.MatchString(hash) && cfg.Keys[hash] == nil {
			cfg.Keys[hash] = key
		}
	}

	for i, o := range f.Overrides {
		path := fmt.Sprintf("overrides[%d]", i)
		if o.Key == "" || len(o.Key) > MaxKeyLen {
			v.addf(path+".key", "required, at most %d bytes", MaxKeyLen)
		}
		if _, ok := cfg.Policies[o.Policy]; !ok {
			v.addf(path+".policy", "unknown policy %q; %s", o.Policy, yamlconf.Valid("policies", names))
			continue
		}
		l, err := sluice.ParseLimit(o.Limit)
		if err != nil {
			v.addf(path+".limit", "%s", strings.TrimPrefix(err.Error(), "sluice: "))
			continue
		}
		l, problem := FitOverride(cfg.Policies[o.Policy], l)
		if problem != "" {
			v.addf(path+".limit", "%s", problem)
			continue
		}
		m := cfg.Overrides[o.Key]
		if m == nil {
			m = map[string]sluice.Limit{}
			cfg.Overrides[o.Key] = m
		}
		if _, dup := m[o.Policy]; dup {
			v.addf(path, "key %q already has an override for policy %q", o.Key, o.Policy)
		}
		m[o.Policy] = l
	}

	v.compileAuthz(&f.Authz, cfg, tierNames)
	if f.Gateway != nil {
		f.Gateway.Regions = cfg.Store.RegionNames() // a global tier's homes
	}
	if f.RLQS != nil {
		f.RLQS.Regions = cfg.Store.RegionNames() // a global policy's homes
	}
	v.validateExtensions(f)
	return cfg
}

func (v *validator) compileStore(s *StoreSection) {
	if s.URLEnv != "" {
		if s.URL = os.Getenv(s.URLEnv); s.URL == "" {
			v.addf("store.url_env", "environment variable %s is not set", s.URLEnv)
			return
		}
	}
	if s.URL == "" {
		s.URL = "memory"
	}
	switch {
	case s.URL == "memory":
	case isRedisURL(s.URL):
	default:
		v.addf("store.url", "unknown store %q; valid: memory, redis://HOST:PORT/DB, rediss://..., redis+cluster://H1:P1,H2:P2, redis+sentinel://S1:P1/MASTER", redactURL(s.URL))
	}
	if s.FailurePolicy == "" {
		s.FailurePolicy = FailLocal
	} else if !slices.Contains(failurePolicies, s.FailurePolicy) {
		v.addf("store.failure_policy", "unknown failure policy %q; valid: %s", s.FailurePolicy, strings.Join(failurePolicies, ", "))
	}
	if s.Timeout == 0 {
		s.Timeout = DefaultStoreTimeout
	} else if s.Timeout < 0 {
		v.addf("store.timeout", "%s must be positive", s.Timeout)
	}
	if s.Instances < 0 || s.Instances > 64 { // 0: learnt from the store's heartbeats
		v.addf("store.instances", "%d must be between 1 and 64, or 0 to count the instances by heartbeat", s.Instances)
	}
	if s.MaxKeys < 0 {
		v.addf("store.max_keys", "%d must not be negative", s.MaxKeys)
	}
	if s.MaxBytes != 0 && s.MaxBytes < MinStoreMaxBytes {
		v.addf("store.max_bytes", "%d must be at least %d (1 MiB), or 0 for the default: a store that small evicts the keys it has just charged, and their limits start over", s.MaxBytes, MinStoreMaxBytes)
	}
}

// Checker is a section that validates itself in place: it records each
// problem at its field, relative to the section, with doc.Addf. The gateway
// section is one.
type Checker interface {
	Check(doc *yamlconf.Doc)
}

// validateExtensions validates every section of File that can: a Checker
// records its problems at their own lines; a section with only a
// `Validate() error` method has its error reported at the section's line.
func (v *validator) validateExtensions(f *File) {
	rv := reflect.ValueOf(f).Elem()
	t := rv.Type()
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		fv := rv.Field(i)
		if fv.Kind() == reflect.Pointer && fv.IsNil() {
			continue
		}
		val := fv.Interface()
		if fv.Kind() != reflect.Pointer && fv.CanAddr() {
			val = fv.Addr().Interface()
		}
		switch s := val.(type) {
		case Checker:
			s.Check(v.doc.Sub(tag))
		case interface{ Validate() error }:
			if err := s.Validate(); err != nil {
				v.addf(tag, "%v", err)
			}
		}
	}
}

func algorithmNames() string {
	var names []string
	for _, a := range sluice.Algorithms() {
		if a != sluice.Concurrency {
			names = append(names, a.String())
		}
	}
	return strings.Join(names, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// LimitFor returns the limit policy p applies to identity: a per-key
// override from the API key's entry (key may be nil), then one from
// `overrides:`, then the policy's own.
func (c *Config) LimitFor(p *Policy, identity string, key *Key) sluice.Limit {
	if key != nil {
		if l, ok := key.Overrides[p.Name]; ok {
			return l
		}
	}
	if len(c.Overrides) > 0 {
		if l, ok := c.Overrides[identity][p.Name]; ok {
			return l
		}
	}
	return p.Limit
}

// PolicyNames lists the policies, sorted.
func (c *Config) PolicyNames() []string { return sortedKeys(c.Policies) }

// TierNames lists the tiers, sorted.
func (c *Config) TierNames() []string { return sortedKeys(c.Tiers) }

// isRedisURL reports whether u names a Redis deployment: a scheme redis,
// rediss, redis+cluster, redis+sentinel or their rediss forms.
func isRedisURL(u string) bool {
	scheme, _, ok := strings.Cut(u, "://")
	return ok && strings.HasPrefix(strings.ToLower(scheme), "redis")
}

// IsMemory reports whether the store section selects the memory store.
func (s StoreSection) IsMemory() bool { return s.URL == "" || s.URL == "memory" }

// redactURL hides a URL's password, so that an error about the URL does not
// print a credential.
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return u.Redacted()
	}
	if i := strings.LastIndex(raw, "@"); i >= 0 {
		return "xxxxx" + raw[i:] // not a parsable URL: drop all before the host
	}
	return raw
}
