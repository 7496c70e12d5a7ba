package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/pricing"
)

// Dollar budgets
//
// A budget is a limit whose unit is the micro-dollar: at most USD spent
// per window, kept in the store like any other limit (a window algorithm
// whose Rate is the budget in micro-dollars). At admission the request's
// maximum cost is reserved on every budget that applies to it, in the
// same all-or-nothing ApplyAll as its rate limits:
//
//	max cost = price(input) × estimated prompt + price(output) × (max_tokens × n)
//
// (cached input is assumed uncached: the reservation is an upper bound).
// At settlement the cost of the usage the upstream reported (input,
// cached input, output and reasoning tokens, each at its price) replaces
// the reservation: the difference is refunded in the refund batch that
// carries the request's lease, so a budget is settled once however many
// gateways try, or charged (OpCharge) when the usage exceeds the
// reservation, as when the prompt estimate was low.
//
// Hard stop: reservations are admitted only while they fit, so the sum of
// the maximum costs of the requests in flight never exceeds what is left;
// a budget is exceeded only by the part of a settled cost above its
// reservation (an underestimated prompt, an upstream ignoring max_tokens),
// bounded per charge by pricing.MaxMicros. A request without a completion
// cap is forwarded with the one it reserved (forwardCap).

// kindBudget is a dollar budget; its costs are micro-dollars.
const kindBudget kind = 16

// statusPath answers a key's limits and spend (status.go).
const statusPath = "/v1/status"

// callBudget is a request's pricing: its model's price, the maximum cost
// reserved, and the cached and reasoning tokens the upstream reported.
type callBudget struct {
	serviceTier       string // the request's service_tier, "" when none
	audio             bool   // audio input or output, priced above text
	priced            bool
	price             pricing.Price
	reserved          pricing.Micros
	cached, reasoning int64
}

// setDetails records the cached and reasoning parts of usage u.
func (b *callBudget) setDetails(u *usageJSON) {
	b.cached, b.reasoning = 0, 0
	for _, d := range []*tokenDetails{u.PromptTokensDetails, u.InputTokensDetails} {
		if d != nil {
			b.cached = addSat(b.cached, d.CachedTokens)
		}
	}
	for _, d := range []*tokenDetails{u.CompletionTokensDetails, u.OutputTokensDetails} {
		if d != nil {
			b.reasoning = addSat(b.reasoning, d.ReasoningTokens)
		}
	}
}

// budgetWindow is the store limit of a budget: its micro-dollars per
// calendar window, enforced by FixedWindow on the store's clock (Redis
// TIME), so that a month is a calendar month in the budget's zone.
func budgetWindow(b BudgetConfig) (sluice.Algorithm, sluice.Limit) {
	// Validated by checkBudgets.
	usd, _ := b.USD.Micros()
	cal := sluice.Calendar{Unit: budgetUnits[b.Per], Location: time.UTC, FirstWeekday: time.Monday}
	if b.Timezone != "" {
		cal.Location, _ = sluice.LoadLocation(b.Timezone)
	}
	if b.ResetAt != "" {
		cal.ResetAt, _ = sluice.ParseClock(b.ResetAt)
	}
	if b.WeekStarts != "" {
		cal.FirstWeekday, _ = sluice.ParseWeekday(b.WeekStarts)
	}
	return sluice.FixedWindow, sluice.PerCalendar(int64(usd), cal)
}

var budgetUnits = map[string]sluice.CalendarUnit{"day": sluice.Day, "week": sluice.Week, "month": sluice.Month, "year": sluice.Year}

// appendBudgetSpecs appends a spec per budget, at level (name).
func appendBudgetSpecs(specs []spec, bs []BudgetConfig, level, name string) []spec {
	for _, b := range bs {
		alg, lim := budgetWindow(b)
		suffix := "usd:" + b.Per
		if b.Model != "" {
			suffix += ":m:" + b.Model
		}
		specs = append(specs, spec{kind: kindBudget, name: "usd_per_" + b.Per, model: b.Model, suffix: suffix, alg: alg, limit: lim,
			level: level, levelName: name, window: b.Per, zone: lim.Calendar.Zone()})
	}
	return specs
}

// scope names whose budget or limit s is, for clients: "key", "team
// research", "org acme".
func (s *spec) scope() string {
	if s.level == "" {
		return "key"
	}
	if s.levelName == "" {
		return s.level // "session"
	}
	return s.level + " " + s.levelName
}

// priceCall prices c's model and its maximum cost. It answers the client
// itself and reports false when the model has no price.
func (g *Gateway) priceCall(w http.ResponseWriter, c *call) bool {
	p, ok := g.prices.Lookup(c.rawModel)
	if !ok {
		g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, "model_not_priced").Inc()
		w.Header().Set("x-should-retry", "false")
		writeError(w, http.StatusBadRequest, "invalid_request_error", "model_not_priced", "model",
			fmt.Sprintf("The model %q has no price in the gateway, so its cost cannot be charged to your budget. Ask the gateway's operator to add it to prices: or set default_price:.", truncateName(c.rawModel)))
		return false
	}
	if dearTiers[strings.ToLower(strings.TrimSpace(c.bud.serviceTier))] {
		g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, "service_tier").Inc()
		w.Header().Set("x-should-retry", "false")
		writeError(w, http.StatusBadRequest, "invalid_request_error", "unsupported_service_tier", "service_tier",
			fmt.Sprintf("service_tier %q is billed above the model's price in the gateway, so a budget could not hold it. Leave service_tier out or use \"auto\", \"default\" or \"flex\".", truncateName(c.bud.serviceTier)))
		return false
	}
	if c.bud.audio {
		g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, "audio").Inc()
		w.Header().Set("x-should-retry", "false")
		writeError(w, http.StatusBadRequest, "invalid_request_error", "unsupported_modality", "modalities",
			"Audio input and output are billed far above the text prices the gateway charges to budgets, so a budget could not hold them. Send text only.")
		return false
	}
	c.bud.priced, c.bud.price = true, p
	if c.defaultCap > 0 && !forwardCap(w, c) {
		return false
	}
	c.bud.reserved = p.Cost(pricing.Usage{pricing.Input: c.promptEst, pricing.Output: max(c.reserved-c.promptEst, 0)})
	return true
}

// dearTiers are the service tiers billed above a model's standard price
// (OpenAI's priority processing, up to twice it; the legacy scale tier),
// which the price table does not know: a request under a budget may not
// ask for one, or it could spend up to twice what its budget charges.
var dearTiers = map[string]bool{"priority": true, "scale": true}

// capFields is the completion cap the upstream reads, by endpoint.
var capFields = map[endpoint]string{epChat: "max_completion_tokens", epCompletions: "max_tokens", epResponses: "max_output_tokens"}

// forwardCap writes the completion cap c reserved (defaultCap, per
// choice) into the body sent upstream when the client set none, so that a
// budget's reservation bounds what the upstream may generate. The body is
// decoded and encoded member by member, as the upstream and parseBody read
// it (the last of duplicate members wins), so that a member spelt with
// escapes or a null cap is replaced rather than shadowing the cap. It
// answers the client itself and reports false on error.
func forwardCap(w http.ResponseWriter, c *call) bool {
	field, ok := capFields[c.ep]
	if !ok {
		return true
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(c.body, &members) != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "", "The request body must be a JSON object.")
		return false
	}
	members[field] = strconv.AppendInt(nil, c.defaultCap, 10)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // as sent: no \u003c for <
	if err := enc.Encode(members); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "", "The request body must be a JSON object.")
		return false
	}
	c.body = bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	return true
}

func truncateName(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}

// budgetCharge is what cost charges a budget: at least 0, at most
// pricing.MaxMicros, so that an upstream reporting absurd usage cannot
// overflow a window's count.
func budgetCharge(cost pricing.Micros) int64 { return int64(min(max(cost, 0), pricing.MaxMicros)) }

// budgetTooLarge answers a request whose maximum cost exceeds a whole
// budget: it can never pass.
func (g *Gateway) budgetTooLarge(w http.ResponseWriter, c *call, s *spec) {
	g.limited(c, s.reason(), 0)
	msg := fmt.Sprintf("You exceeded your current quota: this request may cost up to $%s (estimated prompt %d tokens plus max_tokens times n at %s's prices), more than the whole %s budget of $%s per %s. Reduce max_tokens or the prompt.",
		c.bud.reserved, c.promptEst, truncateName(c.rawModel), s.scope(), pricing.Micros(s.limit.Rate), s.window)
	h := w.Header()
	h.Set("x-should-retry", "false")
	writeError(w, http.StatusTooManyRequests, "insufficient_quota", "insufficient_quota", "", msg)
}

// rejectBudget answers 429 insufficient_quota when a budget denied the
// batch, and reports whether one did. A spent budget outweighs every rate
// limit: nothing passes before its window resets, so Retry-After is the
// reset and x-should-retry tells SDKs not to retry on their own.
func (g *Gateway) rejectBudget(w http.ResponseWriter, c *call, ds []sluice.Decision) bool {
	worst := -1
	for i, d := range ds {
		if !d.Allowed && c.specs[i].kind == kindBudget && (worst < 0 || d.RetryAfter > ds[worst].RetryAfter) {
			worst = i
		}
	}
	if worst < 0 {
		return false
	}
	s, d := c.specs[worst], ds[worst]
	g.limited(c, s.reason(), d.RetryAfter)
	h := w.Header()
	h.Set("x-should-retry", "false")
	h.Set("Retry-After", strconv.FormatInt(max(sluice.CeilSeconds(d.RetryAfter), 1), 10))
	msg := fmt.Sprintf("You exceeded your current quota: the %s budget of $%s per %s has $%s left, and this request may cost up to $%s. It resets in %s.",
		s.scope(), pricing.Micros(s.limit.Rate), s.window, pricing.Micros(max(d.Remaining, 0)), pricing.Micros(c.reqs[worst].Cost), formatReset(d.RetryAfter))
	writeError(w, http.StatusTooManyRequests, "insufficient_quota", "insufficient_quota", "", msg)
	return true
}

// The budget response headers, documented in docs/gateway.md. They
// describe the budget that binds first (the least left), after this
// request's reservation.
const (
	hdrBudgetLimit     = "x-sluice-budget-limit-usd"
	hdrBudgetRemaining = "x-sluice-budget-remaining-usd"
	hdrBudgetReset     = "x-sluice-budget-reset"
	hdrBudgetScope     = "x-sluice-budget-scope"
	hdrBudgetWindow    = "x-sluice-budget-window"
	hdrBudgetReserved  = "x-sluice-budget-reserved-usd"
)

// setBudgetHeaders writes the x-sluice-budget-* headers from the budget
// decisions in ds, if any.
func (g *Gateway) setBudgetHeaders(h http.Header, c *call, ds []sluice.Decision) {
	best := -1
	for i, d := range ds {
		if c.specs[i].kind != kindBudget {
			continue
		}
		if best < 0 || d.Remaining < ds[best].Remaining {
			best = i
		}
	}
	if best < 0 {
		return
	}
	s, d := c.specs[best], ds[best]
	h.Set(hdrBudgetLimit, pricing.Micros(s.limit.Rate).String())
	h.Set(hdrBudgetRemaining, pricing.Micros(max(d.Remaining, 0)).String())
	h.Set(hdrBudgetReset, formatReset(max(d.ResetAfter, d.RetryAfter)))
	h.Set(hdrBudgetScope, s.scope())
	h.Set(hdrBudgetWindow, s.window)
	h.Set(hdrBudgetReserved, pricing.Micros(c.reqs[best].Cost).String())
}

// settleCost prices the usage s settles, when a budget applied.
func (g *Gateway) settleCost(c *call, s *Settlement) {
	if c.client.levels != nil {
		s.Team = c.client.levels.team
	}
	if !c.bud.priced {
		return
	}
	u := pricing.Usage{pricing.Input: s.PromptTokens, pricing.Output: s.CompletionTokens}
	if s.UsageReported {
		u = pricing.OpenAIUsage(s.PromptTokens, c.bud.cached, s.CompletionTokens, c.bud.reasoning)
		s.CachedTokens, s.ReasoningTokens = u[pricing.CachedInput], u[pricing.Reasoning]
	}
	s.ReservedCost, s.Cost = c.bud.reserved, c.bud.price.Cost(u)
}

// countSpend adds a settled cost to the spend metric, by org, team and
// model: never by key.
func (g *Gateway) countSpend(c *call, s *Settlement) {
	if s.Cost <= 0 {
		return
	}
	org, team := "-", "-"
	if lv := c.client.levels; lv != nil {
		if lv.org != "" {
			org = lv.org
		}
		if lv.team != "" {
			team = lv.team
		}
	}
	g.metrics.spend.WithLabelValues(org, team, s.Model).Add(float64(budgetCharge(s.Cost)))
}
