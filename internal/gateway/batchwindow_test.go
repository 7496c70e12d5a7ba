package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/region"
)

// batchWindowDoc: the Batch API on, and a key with a daily and a monthly
// budget (UTC calendar windows), gpt-test at $2.50/M input and $10/M
// output (batch: half).
const batchWindowDoc = `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices: {gpt-test: {input: 2.50, output: 10}}
tiers: {t: {rpm: 1000, budgets: [{usd: 100, per: day}, {usd: 1000, per: month}]}}
keys:
  - {name: one, hash: %[2]s, tier: t, client: CLIENT1}
  - {name: two, hash: %[3]s, tier: t, client: CLIENT2}
batches: {enabled: true}
`

// batchRun drives one key's batches through a gateway with the official
// Go SDK, against up.
type batchRun struct {
	t    *testing.T
	up   *fakeopenai.Batches
	sdk  openai.Client
	file string // an uploaded input file's id
}

func newBatchRun(t *testing.T, up *fakeopenai.Batches, url string) *batchRun {
	t.Helper()
	r := &batchRun{t: t, up: up, sdk: sdk(url, clientKey)}
	f, err := r.sdk.Files.New(context.Background(), openai.FileNewParams{File: openai.File(strings.NewReader(batchFile(6, 20)), "in.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
	if err != nil {
		t.Fatal(err)
	}
	r.file = f.ID
	return r
}

// create starts a batch of the input file and returns its id.
func (r *batchRun) create() string {
	r.t.Helper()
	b, err := r.sdk.Batches.New(context.Background(), openai.BatchNewParams{InputFileID: r.file, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		r.t.Fatal(err)
	}
	return b.ID
}

// complete completes batch id at the provider and looks at it through
// the gateway, which settles it.
func (r *batchRun) complete(id string) {
	r.t.Helper()
	if err := r.up.Complete(id[:strings.LastIndexByte(id, '~')]); err != nil {
		r.t.Fatal(err)
	}
	if b, err := r.sdk.Batches.Get(context.Background(), id); err != nil || b.Status != openai.BatchStatusCompleted {
		r.t.Fatalf("completed batch: %v", err)
	}
}

// A batch's budget hold names the window its charge was taken from: a
// batch created at 23:00 and settled at 13:00 the next day gives its
// unused reservation back to the month (the same window), not to the new
// day, whose money it was never charged to; a batch settled within its
// day gives back to that day. The store's clock and the gateway's are one
// fake clock; memstore, and two gateways on one real Redis.
func TestBatchHoldNamesItsWindow(t *testing.T) {
	start := time.Date(2026, 11, 14, 23, 0, 0, 0, time.UTC)
	t.Run("memstore", func(t *testing.T) {
		clk := clock.NewFake(start)
		st, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		testBatchHoldWindow(t, clk, st)
	})
	t.Run("redis", func(t *testing.T) {
		clk := clock.NewFake(start)
		url := redistest.Standalone(t).URL()
		var stores []sluice.Store
		for range 2 {
			st, err := redisstore.New(context.Background(), redisstore.Options{URL: url, Clock: clk, DisableDenyCache: true, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			stores = append(stores, st)
		}
		testBatchHoldWindow(t, clk, stores...)
	})
}

func testBatchHoldWindow(t *testing.T, clk *clock.Fake, stores ...sluice.Store) {
	// Each output line reports 10 completion tokens of the 100 reserved:
	// most of a reservation is refunded.
	up := fakeopenai.NewBatches(t, fakeopenai.BatchOptions{APIKey: upstreamKey, CompletionTokens: 10})
	e := newBudgetEnv(t, uniqueClients(t, batchWindowDoc), up, stores...)
	for _, gw := range e.gws {
		gw.now = clk.Time
	}
	r := newBatchRun(t, up, e.urls[0])
	day := func() pricing.Micros { return e.spent(clientKey, "key", "day") }
	month := func() pricing.Micros { return e.spent(clientKey, "key", "month") }

	a := r.create()
	resv := day() // every batch holds the same file: one reservation each
	if resv <= 0 || month() != resv {
		t.Fatalf("a batch reserved %s of the day and %s of the month", resv, month())
	}
	r.complete(a)
	used := day() // settled within its day: the day got the rest back
	if used <= 0 || used >= resv || month() != used {
		t.Fatalf("settled in its window: day %s, month %s spent; reserved %s", used, month(), resv)
	}
	b := r.create() // 23:00, held into the next day
	// 13:00: past the middle of the new day, where a refund naming the
	// ended window by 1ns would name today's (the end nearest to now).
	clk.Advance(14 * time.Hour)
	if day() != 0 {
		t.Fatalf("a new day starts with %s spent", day())
	}
	c := r.create()
	if day() != resv || month() != used+2*resv {
		t.Fatalf("after the turn: day %s (want %s), month %s (want %s)", day(), resv, month(), used+2*resv)
	}
	// b's settlement through the other gateway (a replica, on Redis):
	// yesterday's reservation is not today's money.
	if len(e.urls) > 1 {
		r = &batchRun{t: t, up: up, sdk: sdk(e.urls[1], clientKey), file: r.file}
	}
	r.complete(b)
	if day() != resv {
		t.Fatalf("a hold from yesterday settled today changed today's spend from %s to %s", resv, day())
	}
	if month() != 2*used+resv {
		t.Fatalf("the month (b's window still) shows %s spent, want %s: b settled to its usage", month(), 2*used+resv)
	}
	r.complete(c)
	if day() != used || month() != 3*used {
		t.Fatalf("today's batch settled today: day %s (want %s), month %s (want %s)", day(), used, month(), 3*used)
	}
}

// The same outside a global budget's home: a key's daily and monthly
// budgets with scope global, home eu, and two gateways in ap, each on its
// own region.Store over ap's ledger (one redis-server and one fake clock
// stand for both regions, as the region package's fake-clock tests do). A
// batch created and settled in ap within its day gives its unused
// reservation back to ap's share of that day (it was dropped when the
// refund named no window: the share never got it); a second look through
// the other replica refunds nothing more (a region.Store applies a refund
// batch with remote keys one by one, so the queue lease must be released
// first, alone); a batch held over the turn of the day gives nothing to
// the new day's share, and its month's part goes back to the month.
func TestBatchHoldNamesItsWindowAcrossRegions(t *testing.T) {
	start := time.Date(2026, 11, 14, 23, 0, 0, 0, time.UTC)
	clk := clock.NewFake(start)
	srv := redistest.Standalone(t)
	open := func() *redisstore.Store {
		s, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL(), Clock: clk, Timeout: 5 * time.Second, DisableDenyCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	home := open()
	up := fakeopenai.NewBatches(t, fakeopenai.BatchOptions{APIKey: upstreamKey, CompletionTokens: 10})
	doc := strings.Replace(uniqueClients(t, batchWindowDoc), "per: month}]}}", "per: month}], scope: global, home: eu}}", 1)
	cfg, err := parseInRegions("test.yaml", []byte(fmt.Sprintf(doc, up.URL()+"/v1", sluice.HashKey(clientKey), sluice.HashKey(clientKey2))), []string{"ap", "eu"})
	if err != nil {
		t.Fatal(err)
	}
	var shares []*region.Store
	var urls []string
	var gw *Gateway
	for range 2 {
		local := open()
		rs, err := region.New(region.Options{
			Region:      "ap",
			Regions:     map[string]sluice.Store{"ap": local, "eu": home},
			Ledger:      local.Client(),
			Global:      func(req *sluice.Request) bool { _, ok := region.KeyScope(req.Key); return ok },
			Home:        func(string) string { return "eu" },
			Clock:       clk,
			LedgerClock: clk,
			SweepEvery:  -1,
			FetchWait:   time.Minute, // the fake clock does not move while a fetch runs
			CallTimeout: 5 * time.Second,
			// One fetch takes what the day's demand needs, up to the whole
			// budget: no fetch runs in the background while the test reads
			// the shares.
			MaxFraction: 1,
			Horizon:     24 * time.Hour,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rs.Close() })
		g, err := New(Options{Config: cfg, Store: rs, Registerer: prometheus.NewRegistry(), Getenv: func(string) string { return upstreamKey },
			Logger: slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			t.Fatal(err)
		}
		g.now = clk.Time
		s := httptest.NewServer(g)
		t.Cleanup(s.Close)
		shares, urls, gw = append(shares, rs), append(urls, s.URL), g
	}
	// held peeks the window budget's share in ap and its state at home.
	held := func(window string) (share, atHome int64) {
		t.Helper()
		cl := gw.keys[sluice.HashKey(clientKey)]
		for i, s := range cl.levels.specs {
			if s.kind != kindBudget || s.window != window {
				continue
			}
			if h, ok := region.KeyScope(cl.levels.keys[i]); !ok || h != "eu" {
				t.Fatalf("the %s budget is not global: %q", window, cl.levels.keys[i])
			}
			req := sluice.Request{Key: cl.levels.keys[i], Algorithm: s.alg, Limit: s.limit}
			d, err := shares[0].Apply(context.Background(), sluice.OpPeek, req)
			if err != nil || d.Source != sluice.FromShare {
				t.Fatalf("share: %+v %v", d, err)
			}
			h, err := home.Apply(context.Background(), sluice.OpPeek, req)
			if err != nil {
				t.Fatal(err)
			}
			return d.Remaining, h.Remaining
		}
		t.Fatalf("no %s budget", window)
		return 0, 0
	}
	r := newBatchRun(t, up, urls[0])
	// What a batch of the file costs at batch prices, reserved (its
	// max_tokens) and used (10 completion tokens a line, as the fake
	// reports), the fake counting the prompt as OpenAI does.
	price, _ := gw.prices.Lookup("gpt-test")
	var prompt int64
	for _, l := range strings.Split(strings.TrimSpace(batchFile(6, 20)), "\n") {
		prompt += int64(fakeopenai.CountPromptTokens([]byte(l[strings.Index(l, `"body":`)+7 : len(l)-1])))
	}
	used := (int64(price.Cost(pricing.OpenAIUsage(prompt, 0, 60, 0)))*50 + 99) / 100

	a := r.create()
	s0, h0 := held("day")
	resv := 100_000_000 - h0 - s0 // fetched at home, less what ap holds
	if resv <= used || s0 <= 0 {
		t.Fatalf("a batch in ap: share %d, home %d left: reserved %d, uses %d", s0, h0, resv, used)
	}
	r.complete(a)
	if s, h := held("day"); s != s0+resv-used || h != h0 {
		t.Fatalf("a batch settled in its day: ap's share %d (want %d + %d refunded), home %d (want %d)", s, s0, resv-used, h, h0)
	}
	// The other replica's look at the ended batch finds it settled.
	other := &batchRun{t: t, up: up, sdk: sdk(urls[1], clientKey), file: r.file}
	if _, err := other.sdk.Batches.Get(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	if s, _ := held("day"); s != s0+resv-used {
		t.Fatalf("a second settlement through the other replica: ap's share %d, want %d", s, s0+resv-used)
	}

	b := r.create() // 23:00, held into the next day
	m1, _ := held("month")
	clk.Advance(14 * time.Hour)
	c := r.create() // the new day's share, charged at home in the new day
	s2, h2 := held("day")
	m2, _ := held("month")
	if m2 != m1-resv {
		t.Fatalf("month share %d after c, want %d", m2, m1-resv)
	}
	other.complete(b)
	if s, h := held("day"); s != s2 || h != h2 {
		t.Fatalf("a hold from yesterday settled today: ap's share of today %d (want %d), home %d (want %d)", s, s2, h, h2)
	}
	if m, _ := held("month"); m != m2+resv-used {
		t.Fatalf("its month (the same window) got back %d, want %d", m-m2, resv-used)
	}
	r.complete(c)
	if s, _ := held("day"); s != s2+resv-used {
		t.Fatalf("today's batch settled today: ap's share %d, want %d", s, s2+resv-used)
	}
}

// A hold's window ends fit the provider's metadata value (512
// characters, OpenAI's bound, which fakeopenai.Batches enforces) for the
// most budgets a request can have, and read back as written; ends past
// the bound are left out (their refunds name no window), and a value
// from before ends were recorded reads as its amount alone.
func TestHoldWindowsMetadata(t *testing.T) {
	h := hold{cost: math.MaxInt64, ends: map[string]int64{}}
	end := time.Date(2099, 12, 31, 23, 59, 59, 999e6, time.UTC).UnixMilli()
	for i := range maxHoldEnds {
		h.ends[windowTag(fmt.Sprint("budget", i))] = end + int64(i)
	}
	v := h.costValue()
	if len(v) > maxMetadataValue {
		t.Fatalf("%d characters: %q", len(v), v)
	}
	var back hold
	if err := back.parseCost(v); err != nil || back.cost != h.cost || !maps.Equal(back.ends, h.ends) {
		t.Fatalf("read back %+v, %v; wrote %+v", back, err, h)
	}
	for i := range 40 {
		h.ends[windowTag(fmt.Sprint("more", i))] = end
	}
	if v := h.costValue(); len(v) > maxMetadataValue {
		t.Fatalf("%d budgets: %d characters", len(h.ends), len(v))
	}
	var old hold
	if err := old.parseCost("40000"); err != nil || old.cost != 40000 || old.ends != nil {
		t.Fatalf("an old hold: %+v %v", old, err)
	}
	if err := old.parseCost("x 1a2b3c4d:zz"); err == nil {
		t.Fatal("a bad amount was read")
	}
}
