package gateway

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"time"

	"github.com/sluice-io/sluice/internal/mcpgate"
	"github.com/sluice-io/sluice/internal/upstream"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

// ErrInvalidConfig means a gateway configuration is malformed. Load's and
// Validate's errors wrap it.
var ErrInvalidConfig = errors.New("gateway: invalid configuration")

// Defaults for Config fields left empty.
const (
	DefaultListen           = ":8090"
	DefaultMaxTokens        = 1024
	DefaultMaxBodyBytes     = 8 << 20
	DefaultLeaseTTL         = 10 * time.Minute
	DefaultStoreTimeout     = 200 * time.Millisecond
	DefaultUpstreamKeyEnv   = "OPENAI_API_KEY"
	maxModels               = 256
	defaultMaxResponseBytes = 16 << 20
)

var (
	nameRE = regexp.MustCompile(`^[A-Za-z0-9_.:/-]{1,128}$`)
	hashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Config is the gateway's configuration, the `gateway:` section of a
// sluice service file or the whole file of `sluice gateway`. Decode it
// with Load or Parse, which reject unknown fields, apply defaults and
// validate.
type Config struct {
	// Listen is the gateway's address; default ":8090". `sluice serve`
	// runs the gateway on it too, beside the service's own listener.
	Listen string `yaml:"listen"`
	// AllowedHosts are the names, beyond the defaults, by which a browser
	// may reach the gateway (DNS rebinding protection, package hostcheck):
	// a browser's request (Origin, Referer or Sec-Fetch-*) whose Host is
	// not an IP address, localhost, the host of Listen, this machine's name
	// or one of these is refused with 403. "*.example.com" allows the
	// subdomains, "*" turns the check off. At most 256.
	AllowedHosts []string `yaml:"allowed_hosts"`
	// Upstream is where requests go, when Upstreams is empty: a pool of
	// one upstream without provider limits.
	Upstream UpstreamConfig `yaml:"upstream"`
	// Upstreams are the provider accounts and deployments of a pool, each
	// with its limits per model (package upstream); Routes map each
	// client-facing model (or alias, or "*") to the upstreams serving it,
	// with each upstream's model id; Routing chooses among them and bounds
	// failover (pool.go, docs/gateway.md).
	Upstreams []upstream.Def               `yaml:"upstreams"`
	Routes    map[string][]upstream.Target `yaml:"routes"`
	Routing   upstream.Routing             `yaml:"routing"`
	// Store selects where limiter state lives for `sluice gateway`. Inside
	// `sluice serve` the service's store is used instead.
	Store StoreConfig `yaml:"store"`
	// DefaultMaxTokens is the completion budget reserved when a request
	// sets no max_tokens; default 1024. The reservation never exceeds the
	// tier's token burst on its account. When a dollar budget applies, the
	// request is forwarded with that cap (forwardCap).
	DefaultMaxTokens int64 `yaml:"default_max_tokens"`
	// MaxBodyBytes bounds a request body; default 8 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// LeaseTTL is how long a reservation and its concurrency slot live if
	// the gateway never settles them (it crashed); default 10m. A request
	// in flight renews its own every LeaseTTL/3 (renew.go).
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Lease decides the request and token limits (rpm, rpd, tpm) of every
	// tier from capacity leased from Redis in chunks (package lease), unless
	// a tier says otherwise: a hot client's admission then needs Redis only
	// for its reservation. Ignored on the memory store.
	Lease bool `yaml:"lease"`
	// Passthrough lists path prefixes under /v1/ (such as /v1/files) where
	// requests of any method pass through unmetered. Elsewhere, a path the
	// gateway does not meter is refused, but for reads of /v1/models: a
	// POST to /v1/images/generations or a DELETE of a fine-tuned model
	// would run on the gateway's upstream key past every limit, and a read
	// of /v1/files would list every client's files, all under that one key.
	Passthrough []string `yaml:"passthrough"`
	// Models names the models reported as metric labels; others are
	// reported as "other". Models with per-model limits are added.
	Models []string `yaml:"models"`
	// Timezone makes every rpd (of tiers, models, teams and orgs that name
	// no zone of their own) a calendar day in this IANA zone, such as
	// "America/New_York", resetting at local midnight; empty keeps rpd a
	// rolling 24 hours.
	Timezone string `yaml:"timezone"`
	// TokenWeights maps a model, or "*" for every other model, to what a
	// token of each kind counts against its token limits (tpm, itpm,
	// otpm), such as {cached_input: 0.1}; a kind left out counts 1.
	TokenWeights map[string]TokenWeights `yaml:"token_weights"`
	// Tiers are the plans keys belong to.
	Tiers map[string]TierConfig `yaml:"tiers"`
	// Keys maps client API keys, by SHA-256 hash, to tiers.
	Keys []KeyConfig `yaml:"keys"`
	// Queue lets requests over a limit wait, by priority class and fair
	// share, instead of being refused (queue_config.go).
	Queue QueueConfig `yaml:"queue"`
	// Teams and Orgs are the levels above keys: a key may belong to a
	// team and a team to an org, each with limits and budgets shared by
	// all its keys (levels.go).
	Teams map[string]LevelConfig `yaml:"teams"`
	Orgs  map[string]LevelConfig `yaml:"orgs"`
	// Prices adds or replaces model prices in dollars per million tokens,
	// over the shipped list prices (package pricing).
	Prices map[string]PriceConfig `yaml:"prices"`
	// DefaultPrice prices the models Prices and the list do not name.
	// Without it, a request on an unpriced model that a budget applies to
	// is refused (400 model_not_priced).
	DefaultPrice *PriceConfig `yaml:"default_price"`
	// MCPServers are the MCP servers the gateway proxies at
	// /mcp/<name> (MCP's Streamable HTTP transport), metering every
	// tools/call per client key × server × tool (package mcpgate).
	MCPServers []mcpgate.ServerConfig `yaml:"mcp_servers"`
	// Batches serves OpenAI's Batch API under quotas (batches.go).
	Batches BatchConfig `yaml:"batches"`
	// Regions names the regions of serve's store (store.region first,
	// then store.regions), set by the service's config loader, never read
	// from the file: a tier, team or org with scope global needs them.
	// Nil for `sluice gateway` alone.
	Regions []string `yaml:"-"`
}

// UpstreamConfig is the `upstream:` section.
type UpstreamConfig struct {
	// BaseURL is the OpenAI-compatible base URL, including its /v1, such
	// as "https://api.openai.com/v1" or "http://127.0.0.1:11434/v1".
	BaseURL string `yaml:"base_url"`
	// API is the upstream's API: "openai" (the default; the key goes as
	// Authorization: Bearer) or "anthropic" (https://api.anthropic.com/v1;
	// the key goes as x-api-key, default variable ANTHROPIC_API_KEY). The
	// gateway serves both ingresses, OpenAI's paths and Anthropic's
	// /v1/messages, whichever it is; each path goes to this upstream as it
	// came.
	API string `yaml:"api"`
	// APIKeyEnv names the environment variable holding the upstream key;
	// default OPENAI_API_KEY. An empty variable sends no key: `sluice
	// gateway` and `sluice serve` refuse to start so unless the upstream is
	// on loopback (a local vLLM or Ollama) or AllowNoKey is set.
	APIKeyEnv string `yaml:"api_key_env"`
	// AllowNoKey lets the gateway start with an empty key variable for an
	// upstream elsewhere that needs no key.
	AllowNoKey bool `yaml:"allow_no_key"`
	// Timeout bounds the wait for the upstream's response headers; zero
	// means no bound beyond the client's.
	Timeout time.Duration `yaml:"timeout"`
	// CountTokens has a /v1/messages request for a model the gateway
	// cannot count exactly, under a token limit or a budget, counted by
	// the upstream's /v1/messages/count_tokens, and reserves the larger of
	// that count and the estimate (anthropic_count.go).
	CountTokens bool `yaml:"count_tokens"`
}

// StoreConfig is the `store:` section of `sluice gateway`.
type StoreConfig struct {
	// URL is "memory" (the default) or a redis:// URL.
	URL string `yaml:"url"`
	// MaxKeys bounds the memory store's keys; zero means its default.
	MaxKeys int `yaml:"max_keys"`
	// Timeout bounds one store call; default 200ms. A store that fails or
	// times out answers 503: the gateway fails closed rather than
	// multiplying limits by its replica count.
	Timeout time.Duration `yaml:"timeout"`
}

// Limits are the limits of a tier or of one model in a tier. Zero leaves a
// limit out.
type Limits struct {
	// RPM is requests per minute; RPMBurst the requests admitted at once
	// (default RPM).
	RPM      int64 `yaml:"rpm"`
	RPMBurst int64 `yaml:"rpm_burst"`
	// TPM is LLM tokens (prompt plus completion) per minute; TPMBurst the
	// tokens admitted at once (default TPM). A request whose reservation
	// exceeds the burst is rejected as too large.
	TPM      int64 `yaml:"tpm"`
	TPMBurst int64 `yaml:"tpm_burst"`
	// RPD is requests per day: a rolling 24 hours, or, when Timezone is
	// set, a calendar day that resets at local midnight.
	RPD int64 `yaml:"rpd"`
	// Concurrency bounds the requests in flight at once.
	Concurrency int64 `yaml:"concurrency"`
	// Timezone makes RPD a calendar day in this IANA zone, such as
	// "Europe/Berlin" (23 or 25 hours across DST changes); default the
	// tier's timezone, then the config's (calendar.go).
	Timezone string `yaml:"timezone"`
	// ITPM is input tokens (uncached and cached) per minute and OTPM
	// output tokens (visible and reasoning) per minute, as Anthropic
	// limits them, each with its burst (default the rate); tokens count
	// by the model's token_weights (tokenkinds.go).
	ITPM      int64 `yaml:"itpm"`
	ITPMBurst int64 `yaml:"itpm_burst"`
	OTPM      int64 `yaml:"otpm"`
	OTPMBurst int64 `yaml:"otpm_burst"`
}

// TierConfig is one entry of `tiers:`: the fields of Limits for the
// whole tier, and per-model limits.
type TierConfig struct {
	RPM         int64 `yaml:"rpm"`
	RPMBurst    int64 `yaml:"rpm_burst"`
	TPM         int64 `yaml:"tpm"`
	TPMBurst    int64 `yaml:"tpm_burst"`
	RPD         int64 `yaml:"rpd"`
	Concurrency int64 `yaml:"concurrency"`
	// Timezone makes the tier's rpd, and its models', calendar days in
	// this IANA zone; default the config's Timezone.
	Timezone string `yaml:"timezone"`
	// Lease overrides the config's Lease for this tier's limits and its
	// models' limits.
	Lease *bool `yaml:"lease"`
	// Models adds limits for single models, on top of the tier's: a
	// request for such a model must pass both.
	Models map[string]Limits `yaml:"models"`
	// Class is the tier's priority class in queue.classes, and Weight its
	// keys' weight in fair sharing (default 1).
	Class  string  `yaml:"class"`
	Weight float64 `yaml:"weight"`
	// Budgets are dollar budgets each client of the tier has for itself,
	// unless its key names budgets of its own.
	Budgets []BudgetConfig `yaml:"budgets"`
	// ITPM, ITPMBurst, OTPM and OTPMBurst are Limits' input and output
	// token limits for the whole tier.
	ITPM      int64 `yaml:"itpm"`
	ITPMBurst int64 `yaml:"itpm_burst"`
	OTPM      int64 `yaml:"otpm"`
	OTPMBurst int64 `yaml:"otpm_burst"`
	// Session is a budget per session (agent run) of each key of the tier,
	// named by the client in X-Sluice-Session (session.go).
	Session *SessionConfig `yaml:"session"`
	// Scope is "regional" (the default: each region's gateways hold the
	// tier's limits on their own) or "global": the tier's rpm, rpd, tpm,
	// itpm and otpm, its models' and its keys' budgets are each one limit
	// across the regions of serve's store.regions, and Home, when set,
	// names their home region (regions.go, docs/regions.md).
	Scope string `yaml:"scope"`
	Home  string `yaml:"home"`
}

// Tier returns a TierConfig with the limits l for the whole tier.
func Tier(l Limits) TierConfig {
	return TierConfig{RPM: l.RPM, RPMBurst: l.RPMBurst, TPM: l.TPM, TPMBurst: l.TPMBurst, RPD: l.RPD, Concurrency: l.Concurrency, Timezone: l.Timezone,
		ITPM: l.ITPM, ITPMBurst: l.ITPMBurst, OTPM: l.OTPM, OTPMBurst: l.OTPMBurst}
}

// Limits returns the tier-wide limits.
func (t TierConfig) Limits() Limits {
	return Limits{RPM: t.RPM, RPMBurst: t.RPMBurst, TPM: t.TPM, TPMBurst: t.TPMBurst, RPD: t.RPD, Concurrency: t.Concurrency, Timezone: t.Timezone,
		ITPM: t.ITPM, ITPMBurst: t.ITPMBurst, OTPM: t.OTPM, OTPMBurst: t.OTPMBurst}
}

// KeyConfig is one entry of `keys:`.
type KeyConfig struct {
	// Name describes the key in logs; never the key itself.
	Name string `yaml:"name"`
	// Hash is the lowercase hex SHA-256 of the key (sluice.HashKey).
	Hash string `yaml:"hash"`
	// Tier is the tier the key belongs to.
	Tier string `yaml:"tier"`
	// Client groups keys that share limits; default the hash's first 16
	// hex digits, so every key has its own.
	Client string `yaml:"client"`
	// Class and Weight override the tier's (queue_config.go).
	Class  string  `yaml:"class"`
	Weight float64 `yaml:"weight"`
	// Team is the team the key belongs to, if any (Config.Teams).
	Team string `yaml:"team"`
	// Budgets replace the tier's budgets for this key's client.
	Budgets []BudgetConfig `yaml:"budgets"`
}

// Load reads and validates the configuration file at path. Its error
// lists every problem of the file at once, each as "file:line: field:
// message"; it is a *yamlconf.Error wrapping ErrInvalidConfig.
func Load(path string) (*Config, error) {
	data, err := yamlconf.ReadFile(ErrInvalidConfig, path)
	if err != nil {
		return nil, fmt.Errorf("gateway: config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes a configuration document strictly, applies defaults and
// validates it, as the service config's loader does (internal/yamlconf).
// name labels errors, usually the file's path.
func Parse(name string, data []byte) (*Config, error) {
	var c Config
	doc, err := yamlconf.Decode(ErrInvalidConfig, name, data, &c)
	if err != nil {
		return nil, err
	}
	c.Check(doc)
	if err := doc.Err(); err != nil {
		return nil, err
	}
	return &c, nil
}

// ApplyDefaults fills the fields left empty. Validate calls it.
func (c *Config) ApplyDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Upstream.API == "" {
		c.Upstream.API = APIOpenAI
	}
	if c.Upstream.APIKeyEnv == "" {
		c.Upstream.APIKeyEnv = DefaultUpstreamKeyEnv
		if c.Upstream.API == APIAnthropic {
			c.Upstream.APIKeyEnv = DefaultAnthropicKeyEnv
		}
	}
	if c.Store.URL == "" {
		c.Store.URL = "memory"
	}
	if c.Store.Timeout == 0 {
		c.Store.Timeout = DefaultStoreTimeout
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = DefaultMaxTokens
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	for i := range c.Keys {
		if c.Keys[i].Client == "" && len(c.Keys[i].Hash) >= 16 {
			c.Keys[i].Client = c.Keys[i].Hash[:16]
		}
	}
}

// Validate applies defaults and checks a configuration built in code. Its
// error (a *yamlconf.Error wrapping ErrInvalidConfig) names each field.
func (c *Config) Validate() error {
	doc := yamlconf.New(ErrInvalidConfig, "")
	c.Check(doc)
	return doc.Err()
}

// allModels is the bounded set of model labels.
func (c *Config) allModels() []string {
	set := map[string]bool{}
	for _, m := range c.Models {
		set[m] = true
	}
	for _, t := range c.Tiers {
		for m := range t.Models {
			set[m] = true
		}
	}
	for m := range c.Queue.Capacity {
		set[m] = true
	}
	out := make([]string, 0, len(set))
	for m := range set {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
