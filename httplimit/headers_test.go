package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/ratelimittest"
	"github.com/sluice-io/sluice/memstore"
)

// decide runs n requests of cost 1 on a fresh limiter at a fixed instant
// and returns the last decision.
func decide(t *testing.T, alg sluice.Algorithm, l sluice.Limit, n int) sluice.Decision {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	store, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var d sluice.Decision
	for range n {
		if d, err = store.Apply(context.Background(), sluice.OpAllow, sluice.Request{Key: "k", Algorithm: alg, Limit: l, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestHeadersGolden holds the fields of single- and multi-limit answers,
// rate different from burst, to exact values, and checks them against the
// draft's grammar.
func TestHeadersGolden(t *testing.T) {
	burst30 := sluice.Limit{Rate: 10, Period: time.Second, Burst: 30}
	burst5 := sluice.Limit{Rate: 100, Period: time.Minute, Burst: 5}
	for _, c := range []struct {
		name string
		qs   []httplimit.Quota
		want http.Header
	}{{
		name: "10/s burst 30, first request",
		qs:   []httplimit.Quota{{Name: "api", Decision: decide(t, sluice.GCRA, burst30, 1)}},
		want: http.Header{
			"Ratelimit-Policy":      {`"api";q=10;w=1;sluice-burst=30`},
			"Ratelimit":             {`"api";r=29;t=1`},
			"X-Ratelimit-Limit":     {"30"}, // the burst: Remaining never above Limit
			"X-Ratelimit-Remaining": {"29"},
			"X-Ratelimit-Reset":     {"1"},
		},
	}, {
		name: "100/min burst 5, denied",
		qs:   []httplimit.Quota{{Name: "api", Algorithm: sluice.TokenBucket, Decision: decide(t, sluice.TokenBucket, burst5, 6)}},
		want: http.Header{
			"Ratelimit-Policy":      {`"api";q=100;w=60;sluice-burst=5`},
			"Ratelimit":             {`"api";r=0;t=1`},
			"X-Ratelimit-Limit":     {"100"},
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"3"},
			"Retry-After":           {"1"},
		},
	}, {
		name: "3 per 2.5s fixed window",
		qs:   []httplimit.Quota{{Name: "w", Algorithm: sluice.FixedWindow, Decision: decide(t, sluice.FixedWindow, sluice.Limit{Rate: 3, Period: 2500 * time.Millisecond}, 1)}},
		want: http.Header{
			"Ratelimit-Policy":      {`"w";q=6;w=5`},
			"Ratelimit":             {`"w";r=2;t=3`},
			"X-Ratelimit-Limit":     {"3"},
			"X-Ratelimit-Remaining": {"2"},
			"X-Ratelimit-Reset":     {"3"},
		},
	}, {
		// rpm 20 is spent, rpd 1000 is not: the per-minute limit speaks,
		// every value of it, and RateLimit lists it first.
		name: "rpm + rpd, rpm spent",
		qs: []httplimit.Quota{
			{Name: "rpd", Decision: decide(t, sluice.GCRA, sluice.PerDay(1000), 20)},
			{Name: "rpm", Decision: decide(t, sluice.GCRA, sluice.Limit{Rate: 20, Period: time.Minute, Burst: 10}, 10)},
		},
		want: http.Header{
			"Ratelimit-Policy":      {`"rpd";q=1000;w=86400;sluice-burst=1000, "rpm";q=20;w=60;sluice-burst=10`},
			"Ratelimit":             {`"rpm";r=0;t=3, "rpd";r=980;t=87`},
			"X-Ratelimit-Limit":     {"20"},
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"30"},
		},
	}, {
		name: "concurrency and a name to escape",
		qs: []httplimit.Quota{
			{Name: "c", Unit: httplimit.ConcurrentRequests, Algorithm: sluice.Concurrency, Decision: sluice.Decision{Allowed: true, Limit: sluice.Limit{Rate: 4, Period: time.Minute}, Remaining: 3, ResetAfter: time.Minute}},
			{Name: "é\"\\", Decision: decide(t, sluice.GCRA, burst30, 1)},
		},
		want: http.Header{
			"Ratelimit-Policy":      {`"c";q=4;qu="concurrent-requests", "%C3%A9\"\\";q=10;w=1;sluice-burst=30`},
			"Ratelimit":             {`"c";r=3, "%C3%A9\"\\";r=29;t=1`},
			"X-Ratelimit-Limit":     {"4"},
			"X-Ratelimit-Remaining": {"3"},
			"X-Ratelimit-Reset":     {"60"},
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			httplimit.SetHeaders(h, c.qs)
			if !reflect.DeepEqual(h, c.want) {
				t.Errorf("headers\n got %v\nwant %v", h, c.want)
			}
			ratelimittest.Check(t, h)
		})
	}
}

// TestOpenAIHeadersOneLimit is the bug of issue 12: with rpm spent and rpd
// not, every x-ratelimit-*-requests value comes from rpm, never the reset
// of rpd; the limits are rates, not bursts.
func TestOpenAIHeadersOneLimit(t *testing.T) {
	qs := []httplimit.Quota{
		{Name: "rpm", Decision: decide(t, sluice.GCRA, sluice.Limit{Rate: 500, Period: time.Minute, Burst: 50}, 50)},
		{Name: "rpd", Decision: decide(t, sluice.GCRA, sluice.PerDay(10000), 50)},
		{Name: "tpm", Unit: httplimit.Tokens, Decision: decide(t, sluice.GCRA, sluice.Limit{Rate: 30000, Period: time.Minute, Burst: 3000}, 1)},
	}
	h := http.Header{}
	httplimit.SetOpenAIHeaders(h, qs)
	want := http.Header{
		"X-Ratelimit-Limit-Requests":     {"500"},
		"X-Ratelimit-Remaining-Requests": {"0"},
		"X-Ratelimit-Reset-Requests":     {"6s"},
		"X-Ratelimit-Limit-Tokens":       {"30000"},
		"X-Ratelimit-Remaining-Tokens":   {"2999"},
		"X-Ratelimit-Reset-Tokens":       {"2ms"},
	}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("headers\n got %v\nwant %v", h, want)
	}
	// A denial speaks for its unit, however much the others have left.
	qs[1].Decision = sluice.Decision{Limit: sluice.PerDay(10000), Remaining: 0, RetryAfter: time.Hour, ResetAfter: 2 * time.Hour}
	qs[0].Decision.Allowed = true
	h = http.Header{}
	httplimit.SetOpenAIHeaders(h, qs)
	if got := h.Get("X-Ratelimit-Limit-Requests") + " " + h.Get("X-Ratelimit-Reset-Requests"); got != "10000 2h0m0s" {
		t.Fatalf("denied rpd: %q", got)
	}
}

func TestQuotaWindow(t *testing.T) {
	for _, c := range []struct {
		l    sluice.Limit
		q, w int64
	}{
		{sluice.PerSecond(10), 10, 1},
		{sluice.Limit{Rate: 10, Period: time.Second, Burst: 30}, 10, 1},
		{sluice.PerMinute(100), 100, 60},
		{sluice.PerDay(5), 5, 86400},
		{sluice.Limit{Rate: 10, Period: 100 * time.Millisecond}, 100, 1},
		{sluice.Limit{Rate: 3, Period: 2500 * time.Millisecond}, 6, 5},
		{sluice.Limit{Rate: 1, Period: 1500*time.Millisecond + 1}, 1, 2},                  // no exact form: w rounded up, q down
		{sluice.Limit{Rate: 1 << 40, Period: time.Nanosecond}, 999_999_999_999_999, 1},    // clamped to the SF Integer
		{sluice.Limit{Rate: 1 << 40, Period: 366 * 24 * time.Hour}, 1 << 40, 366 * 86400}, // the largest valid
	} {
		q, w := httplimit.QuotaWindow(c.l)
		if q != c.q || w != c.w {
			t.Errorf("%v: q=%d w=%d, want q=%d w=%d", c.l, q, w, c.q, c.w)
		}
		if float64(q)/float64(w) > float64(c.l.Rate)/c.l.Period.Seconds()*(1+1e-12) {
			t.Errorf("%v: q/w = %d/%d overstates the rate", c.l, q, w)
		}
	}
}

// TestMiddlewareHeaders checks the middleware's answers, admitted and
// denied, against the draft.
func TestMiddlewareHeaders(t *testing.T) {
	store, _ := memstore.New(memstore.Options{Clock: clock.NewFake(time.Unix(1_700_000_000, 0))})
	defer store.Close()
	lim, _ := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.Limit{Rate: 10, Period: time.Second, Burst: 3}})
	mw, _ := httplimit.New(httplimit.Options{Limiter: lim, Policy: "api"})
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	var got []string
	for range 4 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		ratelimittest.Check(t, rec.Header())
		got = append(got, rec.Header().Get("RateLimit-Policy")+" | "+rec.Header().Get("RateLimit")+" | "+rec.Header().Get("Retry-After"))
	}
	want := []string{
		`"api";q=10;w=1;sluice-burst=3 | "api";r=2;t=1 | `,
		`"api";q=10;w=1;sluice-burst=3 | "api";r=1;t=1 | `,
		`"api";q=10;w=1;sluice-burst=3 | "api";r=0;t=1 | `,
		`"api";q=10;w=1;sluice-burst=3 | "api";r=0;t=1 | 1`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("answers\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestHeadersHostileInput: odd names, negative and huge counts never make
// an invalid field.
func TestHeadersHostileInput(t *testing.T) {
	for _, name := range []string{"", "\x00\xff", `"`, "a,b;c=d", strings.Repeat("x", 300), "\u2028"} {
		for _, d := range []sluice.Decision{
			{Allowed: true, Limit: sluice.Limit{Rate: 1 << 40, Period: time.Nanosecond}, Remaining: 1 << 62},
			{Limit: sluice.PerSecond(1), Remaining: -5, RetryAfter: -time.Second, ResetAfter: -1},
			{Limit: sluice.Limit{Rate: 1, Period: 366 * 24 * time.Hour}, RetryAfter: 1 << 62, ResetAfter: 1 << 62},
		} {
			for _, alg := range sluice.Algorithms() {
				h := http.Header{}
				httplimit.SetHeaders(h, []httplimit.Quota{{Name: name, Algorithm: alg, Decision: d}, {Name: name + "2", Unit: httplimit.Tokens, Decision: d}})
				ratelimittest.Check(t, h)
			}
		}
	}
}

// FuzzHeaders: whatever the names and numbers, the fields parse as the
// draft's grammar, and the OpenAI triple's reset reads back with
// time.ParseDuration.
func FuzzHeaders(f *testing.F) {
	f.Add("api", int64(10), int64(time.Second), int64(30), int64(29), int64(0), int64(100*time.Millisecond), true, uint8(1), uint8(0))
	f.Add("é\"\\,;=", int64(1<<40), int64(1), int64(0), int64(-5), int64(-1), int64(1<<62), false, uint8(6), uint8(2))
	f.Fuzz(func(t *testing.T, name string, rate, period, burst, remaining, retry, reset int64, allowed bool, alg, unit uint8) {
		q := httplimit.Quota{Name: name, Unit: httplimit.Unit(unit % 3), Algorithm: sluice.Algorithm(alg % 7), Decision: sluice.Decision{
			Allowed: allowed, Limit: sluice.Limit{Rate: rate, Period: time.Duration(period), Burst: burst},
			Remaining: remaining, RetryAfter: time.Duration(retry), ResetAfter: time.Duration(reset),
		}}
		if q.Decision.Limit.Validate() != nil {
			return // the stores never decide on an invalid limit
		}
		h := http.Header{}
		qs := []httplimit.Quota{q, q}
		qs[1].Name += "2"
		httplimit.SetHeaders(h, qs)
		httplimit.SetOpenAIHeaders(h, qs)
		if _, _, err := ratelimittest.Parse(h); err != nil {
			t.Fatalf("%v\n%v", err, h)
		}
		for _, k := range []string{"X-Ratelimit-Reset-Requests", "X-Ratelimit-Reset-Tokens"} {
			if v := h.Get(k); v != "" {
				if _, err := time.ParseDuration(v); err != nil {
					t.Fatalf("%s %q: %v", k, v, err)
				}
			}
		}
	})
}

// TestRemainingNeverAboveLimit: X-RateLimit-Remaining and OpenAI's
// remaining never exceed their Limit, whatever the burst beside the rate
// (issue 27: "X-RateLimit-Remaining: 29" beside "X-RateLimit-Limit: 10"),
// for every algorithm, fresh and part spent; in the IETF fields r never
// exceeds the larger of q and sluice-burst.
func TestRemainingNeverAboveLimit(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.FixedWindow, sluice.SlidingWindowLog, sluice.SlidingWindowCounter} {
		for _, l := range []sluice.Limit{
			{Rate: 10, Period: time.Second, Burst: 30},
			{Rate: 100, Period: time.Minute, Burst: 5},
			{Rate: 7, Period: time.Hour},
		} {
			for _, n := range []int{1, 3} {
				qs := []httplimit.Quota{{Name: "api", Algorithm: alg, Decision: decide(t, alg, l, n)}}
				h := http.Header{}
				httplimit.SetHeaders(h, qs)
				httplimit.SetOpenAIHeaders(h, qs)
				for _, pair := range [][2]string{{"X-Ratelimit-Limit", "X-Ratelimit-Remaining"}, {"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests"}} {
					limit, err1 := strconv.ParseInt(h.Get(pair[0]), 10, 64)
					rem, err2 := strconv.ParseInt(h.Get(pair[1]), 10, 64)
					if err1 != nil || err2 != nil || rem > limit || limit < l.Rate {
						t.Errorf("%v %v after %d: %s %s, %s %s", alg, l, n, pair[0], h.Get(pair[0]), pair[1], h.Get(pair[1]))
					}
				}
				ps, ls, err := ratelimittest.Parse(h)
				if err != nil || len(ps) != 1 || len(ls) != 1 {
					t.Fatalf("%v %v after %d: IETF fields: %v %v %v", alg, l, n, ps, ls, err)
				}
				if most := max(ps[0].Q, ps[0].Burst); ls[0].R > most {
					t.Errorf("%v %v after %d: r=%d above q and sluice-burst (%d)", alg, l, n, ls[0].R, most)
				}
			}
		}
	}
}
