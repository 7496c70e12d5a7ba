package gateway

// The configuration's strict checks (config check): every value and
// reference checked, secrets redacted from the messages.

import (
	"fmt"
	"github.com/sluice-io/sluice/internal/mcpgate"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/hostcheck"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

// Check applies defaults and records every problem of the configuration in
// doc, each at its field. The service config's loader calls it for the
// `gateway:` section, with paths under "gateway".
func (c *Config) Check(doc *yamlconf.Doc) {
	c.checkTokenWeights(doc)
	c.ApplyDefaults()
	if n := len(c.AllowedHosts); n > hostcheck.MaxAllowed {
		doc.Addf("allowed_hosts", "%d hosts; at most %d", n, hostcheck.MaxAllowed)
	}
	for i, h := range c.AllowedHosts {
		norm, err := hostcheck.Normalize(h)
		if err != nil {
			doc.Addf(fmt.Sprintf("allowed_hosts[%d]", i), "%q: %v", hostcheck.Truncate(h, 100), err)
			continue
		}
		c.AllowedHosts[i] = norm
	}
	for i, p := range c.Passthrough {
		field := fmt.Sprintf("passthrough[%d]", i)
		switch {
		case !strings.HasPrefix(p, "/v1/") || canonicalPath(p) != p:
			doc.Addf(field, "%q must be a clean path under /v1/ in lower case, such as /v1/files", redactSecret(p))
		case metersUnder(p) || p == "/v1/batches" || strings.HasPrefix(p, "/v1/batches/"):
			doc.Addf(field, "%q is or holds a metered or refused path (batches), which is never passed through unmetered", p)
		}
	}
	c.checkPool(doc) // pool.go
	c.checkSessions(doc)
	c.checkBatches(doc)
	if err := mcpgate.Validate(c.MCPServers); err != nil {
		doc.Addf("mcp_servers", "%s", strings.TrimPrefix(err.Error(), mcpgate.ErrInvalidConfig.Error()+": "))
	}
	u, err := url.Parse(c.Upstream.BaseURL)
	switch {
	case len(c.Upstreams) > 0:
		if c.Upstream.BaseURL != "" {
			doc.Addf("upstream", "set upstream: (one upstream) or upstreams: (a pool), not both")
		}
	case c.Upstream.BaseURL == "":
		doc.Addf("upstream.base_url", "required, the OpenAI-compatible base URL with its /v1, such as https://api.openai.com/v1 or http://127.0.0.1:11434/v1")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		doc.Addf("upstream.base_url", "%q must be an http or https URL, such as https://api.openai.com/v1", redactURL(c.Upstream.BaseURL))
	}
	if c.Upstream.API != APIOpenAI && c.Upstream.API != APIAnthropic {
		doc.Addf("upstream.api", "unknown API %q; valid: openai, anthropic", redactSecret(c.Upstream.API))
	}
	if !envNameRE.MatchString(c.Upstream.APIKeyEnv) {
		doc.Addf("upstream.api_key_env", "%q is not an environment variable name, such as OPENAI_API_KEY; the key itself belongs in the environment, never in this file", redactSecret(c.Upstream.APIKeyEnv))
	}
	for _, d := range []struct {
		path string
		v    time.Duration
	}{{"upstream.timeout", c.Upstream.Timeout}, {"store.timeout", c.Store.Timeout}, {"lease_ttl", c.LeaseTTL}} {
		if d.v < 0 {
			doc.Addf(d.path, "%s must not be negative", d.v)
		}
	}
	if c.LeaseTTL > 0 && c.LeaseTTL < time.Second {
		doc.Addf("lease_ttl", "%s must be at least 1s", c.LeaseTTL)
	}
	if c.Store.URL != "memory" && !strings.HasPrefix(c.Store.URL, "redis://") && !strings.HasPrefix(c.Store.URL, "rediss://") && !strings.HasPrefix(c.Store.URL, "redis+cluster://") {
		doc.Addf("store.url", "unknown store %q; valid: memory, redis://HOST:PORT/DB, rediss://..., redis+cluster://H1:P1,H2:P2", redactURL(c.Store.URL))
	}
	for _, n := range []struct {
		path string
		v    int64
	}{{"default_max_tokens", c.DefaultMaxTokens}, {"max_body_bytes", c.MaxBodyBytes}, {"store.max_keys", int64(c.Store.MaxKeys)}} {
		if n.v < 0 {
			doc.Addf(n.path, "%d must not be negative", n.v)
		}
	}
	checkTimezone(doc, "timezone", c.Timezone) // calendar.go
	if len(c.Tiers) == 0 {
		doc.Addf("tiers", "at least one tier is required, such as tiers: {free: {rpm: 20, tpm: 40000}}")
	}
	tierNames := sortedKeys(c.Tiers)
	for _, name := range tierNames {
		t := c.Tiers[name]
		path := "tiers." + name
		if !nameRE.MatchString(name) {
			doc.Addf(path, "tier name must be 1-128 letters, digits or _.:/-")
		}
		t.Limits().check(doc, path, c.LeaseTTL)
		if t.Limits() == (Limits{Timezone: t.Timezone}) && len(t.Models) == 0 && len(t.Budgets) == 0 {
			doc.Addf(path, "no limits: set at least one of rpm, tpm, itpm, otpm, rpd, concurrency, models or budgets")
		}
		for _, model := range sortedKeys(t.Models) {
			mpath := path + ".models." + model
			if !nameRE.MatchString(model) {
				doc.Addf(mpath, "model name must be 1-128 letters, digits or _.:/-")
			}
			t.Models[model].check(doc, mpath, c.LeaseTTL)
		}
	}
	for i, m := range c.Models {
		if !nameRE.MatchString(m) {
			doc.Addf(fmt.Sprintf("models[%d]", i), "model name must be 1-128 letters, digits or _.:/-")
		}
	}
	if len(c.allModels()) > maxModels {
		doc.Addf("models", "at most %d models may be named", maxModels)
	}
	seen := map[string]int{}
	for i, k := range c.Keys {
		path := fmt.Sprintf("keys[%d]", i)
		if !hashRE.MatchString(k.Hash) {
			doc.Addf(path+".hash", "want the 64 lowercase hex digits of the key's SHA-256 (sluice keys hash KEY), never the key itself")
		} else if j, dup := seen[k.Hash]; dup {
			doc.Addf(path+".hash", "same key as keys[%d] (%s)", j, c.Keys[j].Name)
		} else {
			seen[k.Hash] = i
		}
		if _, ok := c.Tiers[k.Tier]; !ok {
			if k.Tier == "" {
				doc.Addf(path+".tier", "required; %s", yamlconf.Valid("tiers", tierNames))
			} else {
				doc.Addf(path+".tier", "unknown tier %q; %s", k.Tier, yamlconf.Valid("tiers", tierNames))
			}
		}
		if k.Client != "" && !nameRE.MatchString(k.Client) {
			doc.Addf(path+".client", "%q must be 1-128 letters, digits or _.:/-", k.Client)
		}
	}
	c.checkQueue(doc)
	c.checkLevels(doc)
	c.checkScopes(doc) // regions.go
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// check records the problems of one set of limits at path.
func (l Limits) check(doc *yamlconf.Doc, path string, leaseTTL time.Duration) {
	fields := []struct {
		name string
		v    int64
	}{{"rpm", l.RPM}, {"rpm_burst", l.RPMBurst}, {"tpm", l.TPM}, {"tpm_burst", l.TPMBurst}, {"rpd", l.RPD}, {"concurrency", l.Concurrency},
		{"itpm", l.ITPM}, {"itpm_burst", l.ITPMBurst}, {"otpm", l.OTPM}, {"otpm_burst", l.OTPMBurst}}
	bad := false
	for _, f := range fields {
		if f.v < 0 {
			doc.Addf(path+"."+f.name, "%d must not be negative", f.v)
			bad = true
		}
	}
	if l.RPMBurst > 0 && l.RPM == 0 {
		doc.Addf(path+".rpm_burst", "a burst needs its rate: set rpm too")
		bad = true
	}
	if l.TPMBurst > 0 && l.TPM == 0 {
		doc.Addf(path+".tpm_burst", "a burst needs its rate: set tpm too")
		bad = true
	}
	checkTimezone(doc, path+".timezone", l.Timezone) // calendar.go
	for _, b := range [][3]any{{"itpm", l.ITPM, l.ITPMBurst}, {"otpm", l.OTPM, l.OTPMBurst}} {
		if b[2].(int64) > 0 && b[1].(int64) == 0 {
			doc.Addf(path+"."+b[0].(string)+"_burst", "a burst needs its rate: set %s too", b[0])
			bad = true
		}
	}
	if bad {
		return
	}
	for _, lim := range []struct {
		path string
		l    sluice.Limit
	}{
		{"rpm", sluice.Limit{Rate: l.RPM, Period: time.Minute, Burst: l.RPMBurst}},
		{"tpm", sluice.Limit{Rate: l.TPM, Period: time.Minute, Burst: l.TPMBurst}},
		{"itpm", sluice.Limit{Rate: l.ITPM, Period: time.Minute, Burst: l.ITPMBurst}},
		{"otpm", sluice.Limit{Rate: l.OTPM, Period: time.Minute, Burst: l.OTPMBurst}},
		{"rpd", sluice.Limit{Rate: l.RPD, Period: 24 * time.Hour}},
		{"concurrency", sluice.Limit{Rate: l.Concurrency, Period: max(leaseTTL, time.Second)}},
	} {
		if lim.l.Rate == 0 {
			continue
		}
		if err := lim.l.Validate(); err != nil {
			doc.Addf(path+"."+lim.path, "%s", strings.TrimPrefix(strings.TrimPrefix(err.Error(), "sluice: "), "invalid limit: "))
		}
	}
}

// redactURL hides a URL's password, so that an error does not print it.
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return u.Redacted()
	}
	if i := strings.LastIndex(raw, "@"); i >= 0 {
		return "xxxxx" + raw[i:]
	}
	return raw
}

// redactSecret shows only the start of a value that may be a key.
func redactSecret(s string) string {
	if len(s) > 6 {
		return s[:6] + "..."
	}
	return s
}
