package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluice-io/sluice"
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
	maxConfigBytes          = 16 << 20
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
	// Listen is the address of `sluice gateway`; default ":8090". Inside
	// `sluice serve` the service's listener is used instead.
	Listen string `yaml:"listen"`
	// Upstream is where requests go.
	Upstream UpstreamConfig `yaml:"upstream"`
	// Store selects where limiter state lives for `sluice gateway`. Inside
	// `sluice serve` the service's store is used instead.
	Store StoreConfig `yaml:"store"`
	// DefaultMaxTokens is the completion budget reserved when a request
	// sets no max_tokens; default 1024. The reservation never exceeds the
	// tier's token burst on its account.
	DefaultMaxTokens int64 `yaml:"default_max_tokens"`
	// MaxBodyBytes bounds a request body; default 8 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// LeaseTTL is how long a reservation and its concurrency slot live if
	// the gateway never settles them (it crashed); default 10m. It must
	// exceed the longest upstream request.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Models names the models reported as metric labels; others are
	// reported as "other". Models with per-model limits are added.
	Models []string `yaml:"models"`
	// Tiers are the plans keys belong to.
	Tiers map[string]TierConfig `yaml:"tiers"`
	// Keys maps client API keys, by SHA-256 hash, to tiers.
	Keys []KeyConfig `yaml:"keys"`
}

// UpstreamConfig is the `upstream:` section.
type UpstreamConfig struct {
	// BaseURL is the OpenAI-compatible base URL, including its /v1, such
	// as "https://api.openai.com/v1" or "http://127.0.0.1:11434/v1".
	BaseURL string `yaml:"base_url"`
	// APIKeyEnv names the environment variable holding the upstream key;
	// default OPENAI_API_KEY. An empty variable sends no key (vLLM, Ollama).
	APIKeyEnv string `yaml:"api_key_env"`
	// Timeout bounds the wait for the upstream's response headers; zero
	// means no bound beyond the client's.
	Timeout time.Duration `yaml:"timeout"`
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
	// RPD is requests per day.
	RPD int64 `yaml:"rpd"`
	// Concurrency bounds the requests in flight at once.
	Concurrency int64 `yaml:"concurrency"`
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
	// Models adds limits for single models, on top of the tier's: a
	// request for such a model must pass both.
	Models map[string]Limits `yaml:"models"`
}

// Tier returns a TierConfig with the limits l for the whole tier.
func Tier(l Limits) TierConfig {
	return TierConfig{RPM: l.RPM, RPMBurst: l.RPMBurst, TPM: l.TPM, TPMBurst: l.TPMBurst, RPD: l.RPD, Concurrency: l.Concurrency}
}

// Limits returns the tier-wide limits.
func (t TierConfig) Limits() Limits {
	return Limits{RPM: t.RPM, RPMBurst: t.RPMBurst, TPM: t.TPM, TPMBurst: t.TPMBurst, RPD: t.RPD, Concurrency: t.Concurrency}
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
}

// Load reads and validates the configuration file at path.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gateway: config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("gateway: config %s: %w", path, err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%w: %s: larger than %d bytes", ErrInvalidConfig, path, maxConfigBytes)
	}
	return Parse(path, data)
}

// Parse decodes a configuration document strictly, applies defaults and
// validates it. name labels errors, usually the file's path.
func Parse(name string, data []byte) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c Config
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, name, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &c, nil
}

// ApplyDefaults fills the fields left empty. Validate calls it.
func (c *Config) ApplyDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Upstream.APIKeyEnv == "" {
		c.Upstream.APIKeyEnv = DefaultUpstreamKeyEnv
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

// Validate applies defaults and checks the configuration. Errors wrap
// ErrInvalidConfig and name the field.
func (c *Config) Validate() error {
	c.ApplyDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	u, err := url.Parse(c.Upstream.BaseURL)
	switch {
	case c.Upstream.BaseURL == "":
		bad("upstream.base_url is required, such as https://api.openai.com/v1")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		bad("upstream.base_url %q must be an http or https URL", c.Upstream.BaseURL)
	}
	if c.Upstream.Timeout < 0 || c.Store.Timeout < 0 || c.LeaseTTL < 0 {
		bad("timeouts and lease_ttl must not be negative")
	}
	if c.LeaseTTL > 0 && c.LeaseTTL < time.Second {
		bad("lease_ttl %s must be at least 1s", c.LeaseTTL)
	}
	if c.Store.URL != "memory" && !strings.HasPrefix(c.Store.URL, "redis://") && !strings.HasPrefix(c.Store.URL, "rediss://") && !strings.HasPrefix(c.Store.URL, "redis+cluster://") {
		bad("store.url %q must be memory or a redis:// URL", c.Store.URL)
	}
	if c.DefaultMaxTokens < 0 || c.MaxBodyBytes < 0 || c.Store.MaxKeys < 0 {
		bad("default_max_tokens, max_body_bytes and store.max_keys must not be negative")
	}
	if len(c.Tiers) == 0 {
		bad("tiers: at least one tier is required")
	}
	for _, name := range sortedKeys(c.Tiers) {
		t := c.Tiers[name]
		if !nameRE.MatchString(name) {
			bad("tiers: name %q must match %s", name, nameRE)
		}
		if err := t.Limits().validate(c.LeaseTTL); err != nil {
			bad("tiers.%s: %v", name, err)
		}
		for _, model := range sortedKeys(t.Models) {
			if !nameRE.MatchString(model) {
				bad("tiers.%s.models: name %q must match %s", name, model, nameRE)
			}
			if err := t.Models[model].validate(c.LeaseTTL); err != nil {
				bad("tiers.%s.models.%s: %v", name, model, err)
			}
		}
	}
	for _, m := range c.Models {
		if !nameRE.MatchString(m) {
			bad("models: name %q must match %s", m, nameRE)
		}
	}
	if len(c.allModels()) > maxModels {
		bad("models: at most %d models may be named", maxModels)
	}
	seen := map[string]bool{}
	for i, k := range c.Keys {
		if !hashRE.MatchString(k.Hash) {
			bad("keys[%d] (%s): hash must be 64 lowercase hex digits, the SHA-256 of the key (sluice keys hash)", i, k.Name)
		}
		if seen[k.Hash] {
			bad("keys[%d] (%s): duplicate hash", i, k.Name)
		}
		seen[k.Hash] = true
		if _, ok := c.Tiers[k.Tier]; !ok {
			bad("keys[%d] (%s): unknown tier %q; valid: %s", i, k.Name, k.Tier, strings.Join(sortedKeys(c.Tiers), ", "))
		}
		if !nameRE.MatchString(k.Client) {
			bad("keys[%d] (%s): client %q must match %s", i, k.Name, k.Client, nameRE)
		}
	}
	return errors.Join(errs...)
}

func (l Limits) validate(leaseTTL time.Duration) error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"rpm", l.RPM}, {"rpm_burst", l.RPMBurst}, {"tpm", l.TPM}, {"tpm_burst", l.TPMBurst}, {"rpd", l.RPD}, {"concurrency", l.Concurrency}} {
		if f.v < 0 {
			return fmt.Errorf("%s %d must not be negative", f.name, f.v)
		}
	}
	if l.RPMBurst > 0 && l.RPM == 0 || l.TPMBurst > 0 && l.TPM == 0 {
		return errors.New("a burst needs its rate")
	}
	for _, lim := range []sluice.Limit{
		{Rate: l.RPM, Period: time.Minute, Burst: l.RPMBurst},
		{Rate: l.TPM, Period: time.Minute, Burst: l.TPMBurst},
		{Rate: l.RPD, Period: 24 * time.Hour},
		{Rate: l.Concurrency, Period: max(leaseTTL, time.Second)},
	} {
		if lim.Rate == 0 {
			continue
		}
		if err := lim.Validate(); err != nil {
			return err
		}
	}
	return nil
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
