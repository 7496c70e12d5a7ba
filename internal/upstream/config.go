// Package upstream is the gateway's pool of provider upstreams: several
// OpenAI organizations, Azure OpenAI deployments, Anthropic workspaces and
// OpenAI-compatible servers, each with its own limits per model, behind one
// client-facing model name.
//
// A Pool keeps each upstream's provider limits (rpm, tpm, itpm, otpm per
// model) as sluice limits in the shared store, so that every gateway
// replica draws on one count: a request is sent to an upstream only after
// its reservation was admitted there (Acquire), and settled once with its
// actual usage (Grant.Settle). The provider's own rate-limit headers tighten
// the shared state when it reports less left than the store does (Observe),
// and a provider 429 with Retry-After cools that upstream's model for the
// whole fleet, by charging its request bucket past the limit for that long.
package upstream

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sluice-io/sluice/internal/yamlconf"
)

// Kind is an upstream's API.
type Kind string

// The upstream kinds.
const (
	// OpenAI is api.openai.com or any server of its API; the key goes as
	// Authorization: Bearer.
	OpenAI Kind = "openai"
	// OpenAICompatible is a server speaking OpenAI's API (vLLM, Ollama,
	// a proxy); the key, if any, goes as Authorization: Bearer.
	OpenAICompatible Kind = "openai-compatible"
	// Azure is Azure OpenAI: the path names the deployment
	// (/openai/deployments/{deployment}/chat/completions?api-version=...)
	// and the key goes as api-key.
	Azure Kind = "azure-openai"
	// Anthropic is Anthropic's Messages API; the key goes as x-api-key.
	Anthropic Kind = "anthropic"
)

// DefaultAzureAPIVersion is the api-version sent to Azure OpenAI when an
// upstream names none.
const DefaultAzureAPIVersion = "2024-10-21"

// Policies choose among the upstreams of a route that have room.
const (
	// PolicyCapacity prefers the upstream with the most remaining capacity
	// relative to its limit (the default).
	PolicyCapacity = "capacity"
	// PolicyWeighted picks at random by the upstreams' weights.
	PolicyWeighted = "weighted"
	// PolicyLatency prefers the upstream with the lowest recent time to
	// response headers.
	PolicyLatency = "latency"
)

// Bounds of a pool's configuration.
const (
	MaxUpstreams       = 64
	MaxRouteTargets    = 16
	MaxRoutes          = 256
	DefaultMaxAttempts = 3
	DefaultDeadline    = 30 * time.Second
)

// Def is one entry of the gateway's `upstreams:`.
type Def struct {
	// Name names the upstream in routes, metrics and logs; never a key.
	Name string `yaml:"name"`
	// Kind is the API: openai, anthropic, azure-openai or
	// openai-compatible.
	Kind Kind `yaml:"kind"`
	// BaseURL is the API's base: "https://api.openai.com/v1",
	// "https://api.anthropic.com/v1", an Azure resource's
	// "https://NAME.openai.azure.com", or "http://127.0.0.1:8000/v1".
	BaseURL string `yaml:"base_url"`
	// KeyEnv names the environment variable holding the key; KeyFile a
	// file holding it (a mounted secret). One of them is required unless
	// AllowNoKey is set.
	KeyEnv  string `yaml:"key_env"`
	KeyFile string `yaml:"key_file"`
	// AllowNoKey sends no key (a self-hosted server that needs none).
	AllowNoKey bool `yaml:"allow_no_key"`
	// Region is informative: it labels the upstream in /v1/status.
	Region string `yaml:"region"`
	// Weight is the upstream's share under the weighted policy; default 1.
	Weight float64 `yaml:"weight"`
	// APIVersion is Azure OpenAI's api-version; default
	// DefaultAzureAPIVersion.
	APIVersion string `yaml:"api_version"`
	// Models are the upstream's models (Azure: deployments) by the
	// upstream's own id, with the provider's limits on each.
	Models map[string]Limits `yaml:"models"`
	// Pace, when set, also holds each model's request limit to its share
	// of every window of this length (rpm × pace / minute, at least one):
	// for a provider that enforces a minute's requests over shorter
	// windows, as Azure OpenAI evaluates RPM over 1 or 10 s and OpenAI
	// says it may. Token limits are not paced. Whole milliseconds, 100ms
	// to 30s; zero means none.
	Pace time.Duration `yaml:"pace"`
	// HealthPath is the path, under BaseURL, of the GET that probes the
	// upstream after a connection failure (probe.go), with a query if
	// needed; default the kind's cheapest read, {base_url}/models (Azure
	// OpenAI: {base_url}/openai/models?api-version=...).
	HealthPath string `yaml:"health_path"`
}

// Limits are a provider's limits on one model of one upstream; zero leaves
// a limit out. Each is per minute: the pool sends at most that many in any
// minute, wherever the minute starts.
type Limits struct {
	RPM  int64 `yaml:"rpm" json:"rpm,omitempty"`
	TPM  int64 `yaml:"tpm" json:"tpm,omitempty"`
	ITPM int64 `yaml:"itpm" json:"itpm,omitempty"`
	OTPM int64 `yaml:"otpm" json:"otpm,omitempty"`
}

// Target is one entry of a route: an upstream and its id of the model.
type Target struct {
	// Upstream names an entry of `upstreams:`.
	Upstream string `yaml:"upstream"`
	// Model is the upstream's model id (a dated snapshot, an Azure
	// deployment name); default the route's name.
	Model string `yaml:"model"`
}

// Routing is the gateway's `routing:` section.
type Routing struct {
	// Policy is capacity (the default), weighted or latency.
	Policy string `yaml:"policy"`
	// MaxAttempts bounds the upstreams one request is sent to (failover);
	// default 3.
	MaxAttempts int `yaml:"max_attempts"`
	// Deadline bounds the failover: no further upstream is tried once it
	// has passed since the first was; default 30s.
	Deadline time.Duration `yaml:"deadline"`
	// HeaderTimeout bounds the wait for an upstream's response headers,
	// after which the next upstream is tried; zero means none.
	HeaderTimeout time.Duration `yaml:"header_timeout"`
	// Margin is the fraction of each provider limit left unused (default
	// DefaultMargin): a request admitted here reaches the provider a
	// little later, and not in the order of admission, and the margin
	// absorbs that jitter (2% of a minute is 1.2 s of it).
	Margin *float64 `yaml:"margin"`
	// CountTokens has a /v1/messages request for a model the gateway
	// cannot count exactly counted by an Anthropic upstream of its route
	// (POST /v1/messages/count_tokens, with that upstream's key and model
	// id), when a token limit applies to it, the client's or the
	// provider's; the larger of that count and the estimate is reserved.
	CountTokens bool `yaml:"count_tokens"`
	// Lease, default true, has a replica lease a chunk of a hot upstream
	// model's limits and hand it out until the chunk's slot ends
	// (lease.go); false sends every admission to the store.
	Lease *bool `yaml:"lease"`
}

// azureBaseProblem says what is wrong with an Azure OpenAI base_url's
// path, "" when nothing: the gateway appends /openai/deployments/NAME/...
// to it, so a base_url copied from the portal's deployment URL, or ending
// in /openai, sends every request to a path that answers 404.
func azureBaseProblem(p string) string {
	lp := strings.ToLower(strings.TrimSuffix(p, "/"))
	switch {
	case strings.Contains(lp, "/openai/deployments"):
		return "is a deployment URL"
	case strings.HasSuffix(lp, "/openai"):
		return "ends in /openai"
	case strings.Contains(lp, "/openai/"):
		return "holds /openai/"
	}
	return ""
}

// azureBasePrefix is the part of p before its /openai, the path the
// resource's endpoint keeps (an API gateway's prefix), without a trailing
// slash.
func azureBasePrefix(p string) string {
	if i := strings.Index(strings.ToLower(p), "/openai"); i >= 0 {
		p = p[:i]
	}
	return strings.TrimSuffix(p, "/")
}

// DefaultMargin is Routing.Margin's default.
const DefaultMargin = 0.02

var (
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	modelRE   = regexp.MustCompile(`^[A-Za-z0-9_.:/@-]{1,128}$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	versionRE = regexp.MustCompile(`^[A-Za-z0-9.-]{1,32}$`)
)

// Check records every problem of a pool's configuration in doc: upstreams
// at "upstreams[i]", routes at "routes.NAME", the routing section at
// "routing". A route naming an unknown upstream, or a model the upstream
// does not declare, and an upstream model no route uses, are errors.
// Defaults are applied first.
func Check(doc *yamlconf.Doc, defs []Def, routes map[string][]Target, r *Routing) {
	ApplyDefaults(defs, routes, r)
	if len(defs) > MaxUpstreams {
		doc.Addf("upstreams", "at most %d upstreams", MaxUpstreams)
	}
	byName := map[string]int{}
	for i := range defs {
		d := &defs[i]
		path := fmt.Sprintf("upstreams[%d]", i)
		if !nameRE.MatchString(d.Name) {
			doc.Addf(path+".name", "%q must be 1-64 letters, digits or _.-", redact(d.Name))
		} else if j, dup := byName[d.Name]; dup {
			doc.Addf(path+".name", "%q is also upstreams[%d]", d.Name, j)
		} else {
			byName[d.Name] = i
		}
		switch d.Kind {
		case OpenAI, OpenAICompatible, Azure, Anthropic:
		default:
			doc.Addf(path+".kind", "unknown kind %q; valid: openai, anthropic, azure-openai, openai-compatible", redact(string(d.Kind)))
		}
		u, err := url.Parse(d.BaseURL)
		switch {
		case d.BaseURL == "":
			doc.Addf(path+".base_url", "required, such as https://api.openai.com/v1 or https://NAME.openai.azure.com")
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "":
			doc.Addf(path+".base_url", "%q must be an http or https URL without credentials or query", redactURL(d.BaseURL))
		case d.Kind == Azure && azureBaseProblem(u.Path) != "":
			doc.Addf(path+".base_url", "%q %s: set the resource's endpoint, base_url: %s://%s%s (the gateway adds /openai/deployments/{model}/... and the api-version itself, and each model of models: is a deployment name)",
				redactURL(d.BaseURL), azureBaseProblem(u.Path), u.Scheme, u.Host, azureBasePrefix(u.Path))
		}
		if d.HealthPath != "" && !validHealthPath(d.HealthPath) {
			doc.Addf(path+".health_path", "%q must be a path under base_url, such as /models or /health, at most 256 characters", redact(d.HealthPath))
		}
		switch {
		case d.KeyEnv != "" && d.KeyFile != "":
			doc.Addf(path, "set one of key_env and key_file, not both")
		case d.KeyEnv == "" && d.KeyFile == "" && !d.AllowNoKey:
			doc.Addf(path+".key_env", "required: name the variable holding the upstream's key (or key_file; or allow_no_key: true for a server that needs none)")
		case d.KeyEnv != "" && !envNameRE.MatchString(d.KeyEnv):
			doc.Addf(path+".key_env", "%q is not an environment variable name; the key itself belongs in the environment, never in this file", redact(d.KeyEnv))
		}
		if d.Weight < 0 || d.Weight > 1e6 || d.Weight != d.Weight {
			doc.Addf(path+".weight", "%v must be in (0, 1e6]", d.Weight)
		}
		if d.Pace != 0 && (d.Pace < 100*time.Millisecond || d.Pace > 30*time.Second || d.Pace%time.Millisecond != 0) {
			doc.Addf(path+".pace", "%s must be whole milliseconds from 100ms to 30s, such as 1s or 10s (the windows Azure OpenAI evaluates RPM over)", d.Pace)
		}
		if d.APIVersion != "" && (d.Kind != Azure || !versionRE.MatchString(d.APIVersion)) {
			doc.Addf(path+".api_version", "only an azure-openai upstream takes an api_version, such as %s", DefaultAzureAPIVersion)
		}
		if len(d.Models) == 0 {
			doc.Addf(path+".models", "at least one model (Azure: deployment) is required, such as models: {gpt-4o: {rpm: 500, tpm: 30000}}")
		}
		for _, m := range sortedKeys(d.Models) {
			mp := path + ".models." + m
			if !modelRE.MatchString(m) {
				doc.Addf(mp, "model id must be 1-128 letters, digits or _.:/@-")
			}
			l := d.Models[m]
			for _, f := range []struct {
				name string
				v    int64
			}{{"rpm", l.RPM}, {"tpm", l.TPM}, {"itpm", l.ITPM}, {"otpm", l.OTPM}} {
				if f.v < 0 || f.v > 1<<40 {
					doc.Addf(mp+"."+f.name, "%d must be in [0, 2^40]", f.v)
				}
			}
		}
	}
	if len(defs) > 0 && len(routes) == 0 {
		doc.Addf("routes", "required with upstreams: map each client model to its upstreams, such as routes: {gpt-4o: [{upstream: %s, model: gpt-4o}]}", defs[0].Name)
	}
	if len(routes) > 0 && len(defs) == 0 {
		doc.Addf("routes", "routes need upstreams:")
	}
	if len(routes) > MaxRoutes {
		doc.Addf("routes", "at most %d routes", MaxRoutes)
	}
	used := map[[2]string]bool{}
	for _, name := range sortedKeys(routes) {
		path := "routes." + name
		if name != "*" && !modelRE.MatchString(name) {
			doc.Addf(path, "model name must be 1-128 letters, digits or _.:/@-, or * for every other model")
		}
		ts := routes[name]
		if len(ts) == 0 || len(ts) > MaxRouteTargets {
			doc.Addf(path, "a route lists 1 to %d upstreams", MaxRouteTargets)
		}
		seen := map[[2]string]bool{}
		for i, t := range ts {
			tp := fmt.Sprintf("%s[%d]", path, i)
			j, ok := byName[t.Upstream]
			if !ok {
				doc.Addf(tp+".upstream", "unknown upstream %q; valid: %s", redact(t.Upstream), strings.Join(sortedKeys(byName), ", "))
				continue
			}
			if t.Model == "*" || (t.Model == "" && name == "*") {
				doc.Addf(tp+".model", "the * route needs each upstream's model id")
				continue
			}
			if _, ok := defs[j].Models[t.Model]; !ok {
				doc.Addf(tp+".model", "upstream %s declares no model %q (its models: %s); declare it with its limits under upstreams[%d].models", t.Upstream, redact(t.Model), strings.Join(sortedKeys(defs[j].Models), ", "), j)
			}
			k := [2]string{t.Upstream, t.Model}
			if seen[k] {
				doc.Addf(tp, "upstream %s model %s is listed twice", t.Upstream, t.Model)
			}
			seen[k], used[k] = true, true
		}
	}
	for i, d := range defs {
		for _, m := range sortedKeys(d.Models) {
			if !used[[2]string{d.Name, m}] && len(routes) > 0 {
				doc.Addf(fmt.Sprintf("upstreams[%d].models.%s", i, m), "no route uses this model: add it to a route (routes: {%s: [{upstream: %s, model: %s}]}) or remove it", m, d.Name, m)
			}
		}
	}
	switch r.Policy {
	case PolicyCapacity, PolicyWeighted, PolicyLatency:
	default:
		doc.Addf("routing.policy", "unknown policy %q; valid: capacity, weighted, latency", redact(r.Policy))
	}
	if r.MaxAttempts < 1 || r.MaxAttempts > MaxRouteTargets {
		doc.Addf("routing.max_attempts", "%d must be in [1, %d]", r.MaxAttempts, MaxRouteTargets)
	}
	if m := *r.Margin; m < 0 || m >= 0.5 || m != m {
		doc.Addf("routing.margin", "%v must be in [0, 0.5)", m)
	}
	if r.Deadline < 0 || r.HeaderTimeout < 0 {
		doc.Addf("routing", "deadline and header_timeout must not be negative")
	}
}

// ApplyDefaults fills the fields left empty: a target's model defaults to
// its route's name, a weight to 1, Azure's api-version, and the routing
// section's policy, attempts and deadline.
func ApplyDefaults(defs []Def, routes map[string][]Target, r *Routing) {
	for i := range defs {
		if defs[i].Weight == 0 {
			defs[i].Weight = 1
		}
		if defs[i].Kind == Azure && defs[i].APIVersion == "" {
			defs[i].APIVersion = DefaultAzureAPIVersion
		}
	}
	for name, ts := range routes {
		for i := range ts {
			if ts[i].Model == "" && name != "*" {
				ts[i].Model = name
			}
		}
	}
	if r.Policy == "" {
		r.Policy = PolicyCapacity
	}
	if r.MaxAttempts == 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if r.Deadline == 0 {
		r.Deadline = DefaultDeadline
	}
	if r.Margin == nil {
		m := DefaultMargin
		r.Margin = &m
	}
}

// redact shows only the start of a value that may be a key.
func redact(s string) string {
	if len(s) > 24 {
		return s[:6] + "..."
	}
	return s
}

// redactURL hides a URL's password and query.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return redact(raw)
	}
	u.User, u.RawQuery = nil, ""
	return u.String()
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
