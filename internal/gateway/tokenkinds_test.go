package gateway

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/aitoken"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/memstore"
)

// newKindsEnv is newEnv with token weights.
func newKindsEnv(t *testing.T, l Limits, weights map[string]TokenWeights, upOpts fakeopenai.Options) *env {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	st, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	upOpts.APIKey = upstreamKey
	up := fakeopenai.New(t, upOpts)
	cfg := &Config{
		Upstream:     UpstreamConfig{BaseURL: up.URL() + "/v1", APIKeyEnv: "TEST_UPSTREAM_KEY"},
		Store:        StoreConfig{Timeout: 5 * time.Second},
		Tiers:        map[string]TierConfig{"t": Tier(l)},
		Keys:         []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
		TokenWeights: weights,
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, up: up, store: st, clk: clk, cfg: cfg, client: cfg.Keys[0].Client, settled: make(chan Settlement, 100)}
	e.gw, e.srv, e.upTransport = startGateway(t, cfg, st, func(k string) string { return map[string]string{"TEST_UPSTREAM_KEY": upstreamKey}[k] }, func(s Settlement) { e.settled <- s })
	return e
}

func weight(s string) *Weight {
	w, err := ParseWeight(s)
	if err != nil {
		panic(err)
	}
	return &w
}

const kindsBody = `{"model":"gpt-4o","messages":[{"role":"user","content":"Summarise the history of rate limiting in three lines."}],"max_tokens":100}`

// TestTokenKindsSettlement checks that itpm, otpm and tpm each settle the
// kinds they count at the model's weights: 1000 prompt tokens of which 600
// cached (weight 0.1) and 50 completion tokens of which 20 reasoning
// charge itpm 400+60, otpm 50 and tpm 510.
func TestTokenKindsSettlement(t *testing.T) {
	l := Limits{TPM: 100_000, ITPM: 50_000, OTPM: 10_000}
	e := newKindsEnv(t, l, map[string]TokenWeights{"gpt-4o": {CachedInput: weight("0.1")}},
		fakeopenai.Options{PromptTokens: 1000, CachedTokens: 600, CompletionTokens: 50, ReasoningTokens: 20})
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, kindsBody)
	if _, err := io.Copy(io.Discard, res.Body); err != nil || res.StatusCode != 200 {
		t.Fatalf("status %d, %v", res.StatusCode, err)
	}
	s := e.settle()
	if want := (pricing.Usage{400, 600, 30, 20}); !s.UsageReported || s.Usage != want {
		t.Fatalf("settled usage %v (reported %v), want %v", s.Usage, s.UsageReported, want)
	}
	for _, v := range []struct {
		name       string
		rate, used int64
	}{{"tpm", l.TPM, 510}, {"itpm", l.ITPM, 460}, {"otpm", l.OTPM, 50}} {
		if got := e.remaining(v.name, sluice.GCRA, sluice.Limit{Rate: v.rate, Period: time.Minute}); got != v.rate-v.used {
			t.Errorf("%s remaining %d, want %d (charged %d)", v.name, got, v.rate-v.used, v.used)
		}
	}
	// The prompt was counted exactly for gpt-4o, and reserved whole.
	var r aitoken.Request
	_ = json.Unmarshal([]byte(kindsBody), &r)
	if want := aitoken.ForModel("gpt-4o").PromptTokens(&r) + 100; s.Reserved != want {
		t.Errorf("reserved %d, want the exact prompt plus max_tokens %d", s.Reserved, want)
	}
}

// TestTokenKindsTooLarge checks each kind's burst on its own part of the
// reservation: a prompt over itpm, a max_tokens over otpm, and a default
// budget that shrinks to fit otpm instead.
func TestTokenKindsTooLarge(t *testing.T) {
	e := newKindsEnv(t, Limits{ITPM: 10, OTPM: 1000}, nil, fakeopenai.Options{CompletionTokens: 5})
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, kindsBody)
	if res.StatusCode != 429 || !strings.Contains(decodeError(t, res).Error.Message, "itpm") {
		t.Fatalf("prompt over itpm: status %d", res.StatusCode)
	}
	e = newKindsEnv(t, Limits{ITPM: 1000, OTPM: 99}, nil, fakeopenai.Options{CompletionTokens: 5})
	res = e.post(context.Background(), "/v1/chat/completions", clientKey, kindsBody)
	if res.StatusCode != 429 || !strings.Contains(decodeError(t, res).Error.Message, "otpm") {
		t.Fatalf("max_tokens over otpm: status %d", res.StatusCode)
	}
	// No max_tokens: the default budget (1024) shrinks to otpm's burst.
	res = e.post(context.Background(), "/v1/chat/completions", clientKey, strings.Replace(kindsBody, `,"max_tokens":100`, "", 1))
	if _, err := io.Copy(io.Discard, res.Body); err != nil || res.StatusCode != 200 {
		t.Fatalf("default budget: status %d, %v", res.StatusCode, err)
	}
	var r aitoken.Request
	_ = json.Unmarshal([]byte(kindsBody), &r)
	if s, want := e.settle(), aitoken.ForModel("gpt-4o").PromptTokens(&r)+99; s.Reserved != want {
		t.Fatalf("reserved %d, want the prompt plus otpm's burst, %d", s.Reserved, want)
	}
}

// TestTokenKindsEstimateBounded checks that when the upstream reports no
// usage, each kind's limit keeps a charge at the reservation's weights:
// an estimate is never split into cheap cached tokens.
func TestTokenKindsEstimateBounded(t *testing.T) {
	w := map[string]TokenWeights{"*": {CachedInput: weight("0"), Reasoning: weight("2")}}
	e := newKindsEnv(t, Limits{TPM: 100_000}, w, fakeopenai.Options{})
	c := &call{rawModel: "gpt-4o", promptEst: 100, reserved: 150}
	sp := &spec{kind: kindTokens, sel: selAll}
	if got := e.gw.tokenCost(c, sp); got != 100+2*50 {
		t.Errorf("reservation %d, want 100 input + 50 output at weight 2", got)
	}
	s := &Settlement{PromptTokens: 100, CompletionTokens: 10}
	s.Usage = settledUsage(c, s)
	if got := e.gw.tokenActual(c, sp, s); got != 100+2*10 {
		t.Errorf("estimated actual %d, want 120", got)
	}
	s = &Settlement{PromptTokens: 100, CompletionTokens: 10, UsageReported: true}
	c.bud.cached, c.bud.reasoning = 100, 4
	s.Usage = settledUsage(c, s)
	if got := e.gw.tokenActual(c, sp, s); got != 0+6+2*4 {
		t.Errorf("reported actual %d, want 14", got)
	}
}

func TestWeights(t *testing.T) {
	w := weights{1000, 100, 1000, 2000}
	u := pricing.Usage{60, 40, 30, 20}
	if got := w.apply(u, selKinds[selAll]); got != 60+4+30+40 {
		t.Errorf("apply = %d, want 134", got)
	}
	if got := w.apply(pricing.Usage{0, 1}, selKinds[selInput]); got != 1 {
		t.Errorf("0.1 of a token rounds up to %d, want 1", got)
	}
	big := pricing.Usage{math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64}
	if got := (weights{int64(MaxWeight), int64(MaxWeight), int64(MaxWeight), int64(MaxWeight)}).apply(big, selKinds[selAll]); got != math.MaxInt64 {
		t.Errorf("apply did not saturate: %d", got)
	}
	if got := (weights{-5, 1000}).apply(pricing.Usage{10, -10}, selKinds[selInput]); got != 0 {
		t.Errorf("negative weight or count: %d", got)
	}
	for s, want := range map[string]Weight{"1": 1000, "0.1": 100, "1.25": 1250, "0": 0, "1000": MaxWeight, "0.001": 1, "2.": 2000} {
		if got, err := ParseWeight(s); err != nil || got != want {
			t.Errorf("ParseWeight(%q) = %d, %v; want %d", s, got, err, want)
		}
		if b, _ := want.MarshalText(); func() Weight { v, _ := ParseWeight(string(b)); return v }() != want {
			t.Errorf("MarshalText(%d) = %q does not read back", want, b)
		}
	}
	for _, s := range []string{"", "-1", "1000.001", "0.0001", "1e3", "NaN", "inf", "1,5", ".5", "99999999999999999999"} {
		if _, err := ParseWeight(s); err == nil {
			t.Errorf("ParseWeight(%q) accepted", s)
		}
	}
}

// TestTokenKindsConfig checks the YAML form: weights read exactly, and
// the problems located.
func TestTokenKindsConfig(t *testing.T) {
	good := `upstream: {base_url: "http://127.0.0.1:1/v1"}
token_weights:
  gpt-4o: {cached_input: 0.1, reasoning: 1.5}
  "*": {cached_input: 0.5}
tiers:
  t: {itpm: 30000, itpm_burst: 40000, otpm: 8000, models: {gpt-4o: {otpm: 100}}}
`
	c, err := Parse("good.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if w := c.weightsFor("gpt-4o"); w != (weights{1000, 100, 1000, 1500}) {
		t.Errorf("gpt-4o weights %v", w)
	}
	if w := c.weightsFor("gpt-5"); w != (weights{1000, 500, 1000, 1000}) {
		t.Errorf("default weights %v", w)
	}
	if tc := c.Tiers["t"]; tc.ITPM != 30000 || tc.ITPMBurst != 40000 || tc.OTPM != 8000 || tc.Models["gpt-4o"].OTPM != 100 {
		t.Errorf("tier %+v", tc)
	}
	_, err = Parse("bad.yaml", []byte(`upstream: {base_url: "http://127.0.0.1:1/v1"}
token_weights: {gpt-4o: {cached_input: 0.0001}}
tiers: {t: {rpm: 1}}
`))
	if err == nil || !strings.Contains(err.Error(), `weight "0.0001"`) {
		t.Errorf("a weight finer than 0.001 accepted: %v", err)
	}
	_, err = Parse("bad.yaml", []byte(`upstream: {base_url: "http://127.0.0.1:1/v1"}
token_weights: {"bad model": {input: 1}}
tiers:
  t: {otpm_burst: 5, itpm: -1}
`))
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, want := range []string{"token_weights.bad model", "t.otpm_burst", "t.itpm"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
}
