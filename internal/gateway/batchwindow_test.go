package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
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
