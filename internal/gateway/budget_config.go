package gateway

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

// Bounds of the budget and level configuration.
const (
	maxBudgetsPerLevel = 8
	maxPrices          = 1024
)

// LevelConfig is one entry of `teams:` or `orgs:`: limits and budgets
// shared by every key of the team or org. A request is charged at every
// level it belongs to, key, team and org, in one atomic step.
type LevelConfig struct {
	// Limits are the level's rpm, tpm, rpd and concurrency, shared by its
	// keys.
	Limits `yaml:",inline"`
	// Org is the org a team belongs to; teams only.
	Org string `yaml:"org"`
	// Budgets are the level's dollar budgets, shared by its keys.
	Budgets []BudgetConfig `yaml:"budgets"`
	// Scope and Home are TierConfig's, for the level's limits and
	// budgets (regions.go).
	Scope string `yaml:"scope"`
	Home  string `yaml:"home"`
}

// BudgetConfig is a dollar budget: at most USD spent per window.
type BudgetConfig struct {
	// USD is the budget in dollars, such as 100 or 0.50; at most six
	// decimals and pricing.MaxMicros (about $1.1M).
	USD USD `yaml:"usd"`
	// Per is the window: day, week, month or year.
	Per string `yaml:"per"`
	// Timezone is the IANA time zone whose calendar the window follows,
	// such as Europe/Berlin; default UTC. The window starts at local
	// midnight, or at ResetAt ("09:00"), on the first day of the unit:
	// days are 23 or 25 hours long across DST changes, months 28 to 31
	// days (sluice.Calendar).
	Timezone string `yaml:"timezone"`
	// ResetAt is the local wall time windows start at, "HH:MM"; default
	// 00:00.
	ResetAt string `yaml:"reset_at"`
	// WeekStarts is the first day of a week window; default monday.
	WeekStarts string `yaml:"week_starts"`
	// Model, when set, limits the budget to requests on that model.
	Model string `yaml:"model"`
}

// PriceConfig is a model's price in dollars per million tokens of each
// kind, such as {input: 2.50, cached_input: 1.25, output: 10}. Omitted,
// cached_input costs what input does and reasoning what output does.
type PriceConfig struct {
	Input       USD `yaml:"input"`
	CachedInput USD `yaml:"cached_input"`
	Output      USD `yaml:"output"`
	Reasoning   USD `yaml:"reasoning"`
}

// USD is an amount of dollars as written, such as "2.50": the YAML
// scalar's text, read exactly by pricing.ParseUSD and never through a
// float. Empty means unset.
type USD string

// Micros reads u; empty is 0.
func (u USD) Micros() (pricing.Micros, error) {
	if u == "" {
		return 0, nil
	}
	return pricing.ParseUSD(string(u))
}

// Price is p as a pricing.Price; its error names the kind that could not
// be read.
func (p PriceConfig) Price() (pricing.Price, error) {
	var pr pricing.Price
	for k, u := range [pricing.NumKinds]USD{p.Input, p.CachedInput, p.Output, p.Reasoning} {
		m, err := u.Micros()
		if err != nil {
			return pr, fmt.Errorf("%s: %w", pricing.Kind(k), err)
		}
		pr[k] = m
	}
	if p.CachedInput == "" {
		pr[pricing.CachedInput] = pr[pricing.Input]
	}
	if p.Reasoning == "" {
		pr[pricing.Reasoning] = pr[pricing.Output]
	}
	return pr, pr.Validate()
}

// budgetWindows are the values of BudgetConfig.Per.
var budgetWindows = []string{"day", "week", "month", "year"}

// priceTable is the shipped prices with the configuration's on top.
func (c *Config) priceTable() *pricing.Table {
	t := pricing.Defaults()
	for m, p := range c.Prices {
		pr, _ := p.Price() // validated
		t.Set(m, pr)
	}
	if c.DefaultPrice != nil {
		pr, _ := c.DefaultPrice.Price()
		t.SetFallback(pr)
	}
	return t
}

// checkLevels records the problems of teams, orgs, budgets and prices.
func (c *Config) checkLevels(doc *yamlconf.Doc) {
	orgNames := sortedKeys(c.Orgs)
	for _, name := range orgNames {
		o := c.Orgs[name]
		path := "orgs." + name
		if !nameRE.MatchString(name) {
			doc.Addf(path, "org name must be 1-128 letters, digits or _.:/-")
		}
		if o.Org != "" {
			doc.Addf(path+".org", "an org belongs to no org; org is a field of teams")
		}
		o.Limits.check(doc, path, c.LeaseTTL)
		checkBudgets(doc, path+".budgets", o.Budgets)
	}
	teamNames := sortedKeys(c.Teams)
	for _, name := range teamNames {
		t := c.Teams[name]
		path := "teams." + name
		if !nameRE.MatchString(name) {
			doc.Addf(path, "team name must be 1-128 letters, digits or _.:/-")
		}
		if _, ok := c.Orgs[t.Org]; t.Org != "" && !ok {
			doc.Addf(path+".org", "unknown org %q; %s", t.Org, yamlconf.Valid("orgs", orgNames))
		}
		t.Limits.check(doc, path, c.LeaseTTL)
		checkBudgets(doc, path+".budgets", t.Budgets)
	}
	for _, name := range sortedKeys(c.Tiers) {
		checkBudgets(doc, "tiers."+name+".budgets", c.Tiers[name].Budgets)
	}
	clients := map[string]int{}
	for i, k := range c.Keys {
		path := fmt.Sprintf("keys[%d]", i)
		if _, ok := c.Teams[k.Team]; k.Team != "" && !ok {
			doc.Addf(path+".team", "unknown team %q; %s", k.Team, yamlconf.Valid("teams", teamNames))
		}
		checkBudgets(doc, path+".budgets", k.Budgets)
		// Keys that share a client share its limits, so they must agree on
		// what those are.
		if j, seen := clients[k.Client]; seen && k.Client != "" {
			o := c.Keys[j]
			if o.Team != k.Team {
				doc.Addf(path+".team", "keys[%d] has the same client %q with team %q: keys of one client share one team", j, k.Client, o.Team)
			}
			if !slices.Equal(o.Budgets, k.Budgets) {
				doc.Addf(path+".budgets", "keys[%d] has the same client %q with other budgets: keys of one client share them", j, k.Client)
			}
		} else {
			clients[k.Client] = i
		}
	}
	if len(c.Prices) > maxPrices {
		doc.Addf("prices", "at most %d models may be priced", maxPrices)
	}
	for _, m := range sortedKeys(c.Prices) {
		checkPrice(doc, "prices."+m, c.Prices[m])
		if !nameRE.MatchString(m) {
			doc.Addf("prices."+m, "model name must be 1-128 letters, digits or _.:/-")
		}
	}
	if c.DefaultPrice != nil {
		checkPrice(doc, "default_price", *c.DefaultPrice)
	}
}

func checkPrice(doc *yamlconf.Doc, path string, p PriceConfig) {
	for k, u := range [pricing.NumKinds]USD{p.Input, p.CachedInput, p.Output, p.Reasoning} {
		m, err := u.Micros()
		if err != nil || m > pricing.MaxPrice {
			doc.Addf(path+"."+pricing.Kind(k).String(), "%q is not a price: want 0 to %s dollars per million tokens with at most six decimals, such as 2.50", truncateName(string(u)), pricing.MaxPrice)
		}
	}
}

// checkBudgets records the problems of one level's budgets.
func checkBudgets(doc *yamlconf.Doc, path string, bs []BudgetConfig) {
	if len(bs) > maxBudgetsPerLevel {
		doc.Addf(path, "at most %d budgets per level", maxBudgetsPerLevel)
	}
	seen := map[string]int{}
	for i, b := range bs {
		p := fmt.Sprintf("%s[%d]", path, i)
		if m, err := b.USD.Micros(); err != nil || m <= 0 {
			doc.Addf(p+".usd", "%q: want a positive amount of dollars up to %s with at most six decimals, such as 100 or 2.50", truncateName(string(b.USD)), pricing.MaxMicros)
		}
		if !slices.Contains(budgetWindows, b.Per) {
			doc.Addf(p+".per", "%q is not a window; valid: %s", b.Per, strings.Join(budgetWindows, ", "))
		}
		if b.Timezone != "" {
			if _, err := sluice.LoadLocation(b.Timezone); err != nil {
				doc.Addf(p+".timezone", "%q is not an IANA time zone, such as Europe/Berlin or America/New_York", truncateName(b.Timezone))
			}
		}
		if b.ResetAt != "" {
			if _, err := sluice.ParseClock(b.ResetAt); err != nil {
				doc.Addf(p+".reset_at", "%q: want a local time HH:MM, such as 09:00", truncateName(b.ResetAt))
			}
		}
		if b.WeekStarts != "" {
			if _, err := sluice.ParseWeekday(b.WeekStarts); err != nil || b.Per != "week" {
				doc.Addf(p+".week_starts", "%q: want a weekday such as monday, for a budget per week", truncateName(b.WeekStarts))
			}
		}
		if b.Model != "" && !nameRE.MatchString(b.Model) {
			doc.Addf(p+".model", "model name must be 1-128 letters, digits or _.:/-")
		}
		id := b.Per + "/" + b.Model
		if j, dup := seen[id]; dup {
			doc.Addf(p, "same window and model as %s[%d]: one budget per window and model", path, j)
		}
		seen[id] = i
	}
}
