package gateway

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
)

// With a timezone, rpd is a calendar day: spent on the evening of New
// York's fall-back day (25 hours), it stays spent across UTC midnight and
// comes back exactly at local midnight, which Retry-After names.
func TestRPDCalendarDay(t *testing.T) {
	rpdCalendarDay(t, newEnv(t, Limits{RPD: 2, TPM: 60000, Timezone: "America/New_York"}, fakeopenai.Options{}))
}

// The same on a 3-master Redis Cluster, whose script picks the window
// from the boundaries the gateway sends (the fake clock's time is sent
// along, as storetest does).
func TestRPDCalendarDayRedisCluster(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	st, err := redisstore.New(context.Background(), redisstore.Options{
		URL: redistest.SharedCluster(t).URL(), Clock: clk, DisableDenyCache: true, Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	client := strings.NewReplacer(":", "", "/", "").Replace(redistest.Prefix(t))
	client = client[len(client)-6:] + "c"
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	rpdCalendarDay(t, newEnvUpstream(t, Limits{RPD: 2, TPM: 60000, Timezone: "America/New_York"}, up, st, clk, client))
}

func rpdCalendarDay(t *testing.T, e *env) {
	t.Helper()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	e.clk.Set(time.Date(2026, 11, 1, 18, 0, 0, 0, ny)) // 23:00 UTC
	midnight := time.Date(2026, 11, 2, 0, 0, 0, 0, ny)
	for range 2 {
		if res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody); res.StatusCode != http.StatusOK {
			t.Fatalf("status %d", res.StatusCode)
		}
		e.settle()
	}
	deny := func(at time.Time) {
		t.Helper()
		e.clk.Set(at)
		res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
		if res.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("at %s: status %d", at, res.StatusCode)
		}
		ae := decodeError(t, res)
		if !strings.Contains(ae.Error.Message, "requests per day (rpd)") || !strings.Contains(ae.Error.Message, "2/day in America/New_York") {
			t.Fatalf("error %+v", ae.Error)
		}
		want := sluice.CeilSeconds(midnight.Sub(at))
		if got := res.Header.Get("Retry-After"); got != strconv.FormatInt(want, 10) {
			t.Fatalf("at %s: Retry-After %s, want %d (to local midnight)", at, got, want)
		}
	}
	deny(time.Date(2026, 11, 1, 18, 0, 1, 0, ny))
	deny(time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)) // UTC midnight resets nothing
	deny(midnight.Add(-time.Millisecond))
	e.clk.Set(midnight)
	if res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody); res.StatusCode != http.StatusOK {
		t.Fatalf("at local midnight: status %d", res.StatusCode)
	}
	e.settle()
}

func TestTimezoneConfig(t *testing.T) {
	cfg, err := Parse("gw.yaml", []byte(`
upstream: {base_url: "http://127.0.0.1:1/v1"}
timezone: Europe/Berlin
tiers:
  free: {rpd: 100}
  tokyo: {rpd: 100, timezone: Asia/Tokyo, models: {big: {rpd: 5}}}
  rolling: {rpm: 10}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		l    Limits
		zone string
		want string
	}{
		{cfg.Tiers["free"].Limits(), cfg.Timezone, "100/day in Europe/Berlin"},
		{cfg.Tiers["tokyo"].Limits(), cfg.Timezone, "100/day in Asia/Tokyo"},
		{cfg.Tiers["tokyo"].Models["big"], "Asia/Tokyo", "5/day in Asia/Tokyo"},
		{Limits{RPD: 7}, "", "7/day"},
	} {
		alg, l := c.l.inZone(c.zone).rpd()
		if l.String() != c.want || (alg == sluice.FixedWindow) != !l.Calendar.IsZero() {
			t.Errorf("%+v in %q: %s by %s, want %s", c.l, c.zone, l, alg, c.want)
		}
	}
	for _, bad := range []string{"timezone: Mars/Base\n", "tiers: {x: {rpd: 1, timezone: Local}}\n", "tiers: {x: {rpd: 1, models: {m: {rpd: 1, timezone: \"../etc\"}}}}\n"} {
		_, err := Parse("gw.yaml", []byte("upstream: {base_url: \"http://127.0.0.1:1/v1\"}\n"+bad+"tiers: {free: {rpd: 1}}\n"))
		if strings.HasPrefix(bad, "tiers") {
			_, err = Parse("gw.yaml", []byte("upstream: {base_url: \"http://127.0.0.1:1/v1\"}\n"+bad))
		}
		if err == nil || !strings.Contains(err.Error(), "is not an IANA time zone") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// Team and org rpd follow the same rule as a tier's: a calendar day in the
// level's timezone, else the configuration's, else a rolling 24 hours.
func TestLevelRPDCalendar(t *testing.T) {
	for _, c := range []struct{ zone, team, org string }{
		{"timezone: America/New_York\n", "3/day in America/New_York", "5/day in Asia/Tokyo"},
		{"", "3/day", "5/day in Asia/Tokyo"},
	} {
		cfg, err := Parse("gw.yaml", []byte(`
upstream: {base_url: "http://127.0.0.1:1/v1"}
`+c.zone+`tiers: {t: {rpm: 10}}
orgs: {acme: {rpd: 5, timezone: Asia/Tokyo}}
teams: {research: {org: acme, rpd: 3}}
keys: [{name: one, hash: `+sluice.HashKey(clientKey)+`, tier: t, team: research}]
`))
		if err != nil {
			t.Fatal(err)
		}
		st, _ := memstore.New(memstore.Options{SweepInterval: -1})
		t.Cleanup(func() { _ = st.Close() })
		gw, err := New(Options{Config: cfg, Store: st, Getenv: func(string) string { return upstreamKey }})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, s := range gw.keys[sluice.HashKey(clientKey)].levels.specs {
			if s.name == "rpd" {
				if (s.alg == sluice.FixedWindow) == s.limit.Calendar.IsZero() {
					t.Errorf("%s rpd %s by %s", s.level, s.limit, s.alg)
				}
				got[s.level] = s.limit.String()
			}
		}
		if got["team"] != c.team || got["org"] != c.org {
			t.Errorf("%q: team rpd %q, org rpd %q; want %q, %q", c.zone, got["team"], got["org"], c.team, c.org)
		}
	}
}

// A request admitted on a day's budget and still streaming at local
// midnight is settled in the next day. Its refund (the reservation,
// max_tokens priced, less what it used) names the day it was charged in,
// and that day has ended: it is dropped. Given to the new day, it would
// free money the new day's own requests had spent: here all of it (the
// count is clamped at zero), and a day could admit up to the
// reservations in flight at its start on top of its budget. The store's
// clock is moved across midnight while the upstream holds the stream
// (fakeopenai's Hold, as a long generation does).
func TestBudgetRefundAfterMidnight(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2026, 3, 10, 23, 59, 50, 0, berlin))
	st, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	hold, held := make(chan struct{}), make(chan struct{})
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, CompletionTokens: 100})
	doc := `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices:
  gpt-test: {input: 2.50, output: 10}
tiers:
  t: {rpm: 100000, budgets: [{usd: 1.00, per: day, timezone: Europe/Berlin}]}
keys:
  - {name: one, hash: %[2]s, tier: t, client: c1}
  - {name: two, hash: %[3]s, tier: t, client: c2}
`
	e := newBudgetEnv(t, doc, up, st)
	stream := `{"model":"gpt-test","stream":true,` + msgs + `,"max_tokens":2000}`
	up.Enqueue(fakeopenai.Fault{HoldAfter: 1, Hold: hold, Held: held})
	done := make(chan struct{})
	go func() {
		defer close(done)
		res := e.do(0, http.MethodPost, "/v1/chat/completions", clientKey, stream)
		if res.StatusCode != http.StatusOK {
			t.Errorf("the stream: status %d", res.StatusCode)
		}
		_, _ = io.Copy(io.Discard, res.Body)
	}()
	<-held
	// Twenty seconds later: the next day. A request of the new day,
	// settled at once.
	clk.Advance(20 * time.Second)
	res := e.do(0, http.MethodPost, "/v1/chat/completions", clientKey, `{"model":"gpt-test",`+msgs+`,"max_tokens":2000}`)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("the new day's request: status %d", res.StatusCode)
	}
	today := e.settle().Cost
	if got := e.spent(clientKey, "key", "day"); got != today {
		t.Fatalf("the new day spent %s, its request cost %s", got, today)
	}
	// The stream ends: its settlement refunds most of its reservation.
	close(hold)
	<-done
	s := e.settle()
	if s.ReservedCost <= 2*s.Cost {
		t.Fatalf("the stream reserved %s and cost %s: no refund to speak of", s.ReservedCost, s.Cost)
	}
	if got := e.spent(clientKey, "key", "day"); got != today {
		t.Fatalf("after yesterday's request settled, the new day's spend is %s, want %s: its refund of %s freed the new day's money",
			got, today, s.ReservedCost-s.Cost)
	}
}
