package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/nodesdk"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/redistest"
)

// batchDoc: the Batch API on, a queue of 1000 enqueued prompt tokens per
// key, a $100 monthly budget per key, gpt-test at $2.50/M input and $10/M
// output (batch: half).
const batchDoc = `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices: {gpt-test: {input: 2.50, output: 10}}
tiers: {t: {rpm: 1000, budgets: [{usd: 100, per: month}]}}
keys:
  - {name: one, hash: %[2]s, tier: t, client: CLIENT1}
  - {name: two, hash: %[3]s, tier: t, client: CLIENT2}
batches: {enabled: true, queue_tokens: {"*": 1000}}
`

func batchFile(lines int, words int) string {
	var b strings.Builder
	for i := range lines {
		fmt.Fprintf(&b, `{"custom_id":"r%d","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-test","messages":[{"role":"user","content":%q}],"max_tokens":100}}`+"\n",
			i, strings.TrimSpace(strings.Repeat("word ", words)))
	}
	return b.String()
}

func sdk(url, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

func apiErr(t *testing.T, err error, status int, code string) {
	t.Helper()
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != status || (code != "" && ae.Code != code) {
		t.Fatalf("want %d %s, got %v (%+v)", status, code, err, ae)
	}
}

// TestBatchAPIUnderQuotas, with the official Go SDK through two gateways
// on one Redis: a key uploads, creates, retrieves, lists and cancels its
// batches; the other key can neither see nor fetch them; enqueued tokens
// over the queue are refused in OpenAI's shape; on completion the budget
// is charged the output's usage at batch prices, once, and a cancelled
// batch gives everything back.
func TestBatchAPIUnderQuotas(t *testing.T) {
	up := fakeopenai.NewBatches(t, fakeopenai.BatchOptions{APIKey: upstreamKey, FailEvery: 3})
	e := newBudgetEnv(t, uniqueClients(t, batchDoc), up, redisStores(t, redistest.Standalone(t).URL())...)
	ctx := context.Background()
	one, oneB, two := sdk(e.urls[0], clientKey), sdk(e.urls[1], clientKey), sdk(e.urls[1], clientKey2)

	content := batchFile(6, 20)
	f, err := one.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader(content), "in.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
	if err != nil {
		t.Fatal(err)
	}
	// The other key cannot read the file or its content.
	_, err = two.Files.Get(ctx, f.ID)
	apiErr(t, err, 404, "")
	_, err = two.Files.Content(ctx, f.ID)
	apiErr(t, err, 404, "")
	// Nor start a batch from it.
	_, err = two.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	apiErr(t, err, 404, "")

	b, err := one.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h, Metadata: shared.Metadata{"job": "nightly"}})
	if err != nil {
		t.Fatal(err)
	}
	if b.InputFileID != f.ID || b.Metadata["job"] != "nightly" || len(b.Metadata) != 1 {
		t.Fatalf("batch as created: input %q metadata %v", b.InputFileID, b.Metadata)
	}
	reserved := e.spent(clientKey, "key", "month")
	if reserved <= 0 {
		t.Fatal("nothing reserved against the budget")
	}
	// Retrieved through the other replica, listed by its owner only.
	if got, err := oneB.Batches.Get(ctx, b.ID); err != nil || got.ID != b.ID {
		t.Fatalf("get through the other gateway: %v", err)
	}
	_, err = two.Batches.Get(ctx, b.ID)
	apiErr(t, err, 404, "")
	if page, err := two.Batches.List(ctx, openai.BatchListParams{}); err != nil || len(page.Data) != 0 {
		t.Fatalf("the other key's list: %v %d batches", err, len(page.Data))
	}
	if page, err := one.Batches.List(ctx, openai.BatchListParams{}); err != nil || len(page.Data) != 1 || page.Data[0].ID != b.ID {
		t.Fatalf("the owner's list: %v %+v", err, page)
	}

	// The queue holds 1000 enqueued tokens: a file of about 900 more is
	// refused while the first batch is in progress.
	big, err := one.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader(batchFile(7, 120)), "big.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
	if err != nil {
		t.Fatal(err)
	}
	_, err = one.Batches.New(ctx, openai.BatchNewParams{InputFileID: big.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	apiErr(t, err, 429, "token_limit_exceeded")
	// The console saw the batch admitted, and the second one's 429.
	if got := e.reported(); fmt.Sprint(got) != "[gw_key:one false  gw_key:one true batch_queue]" {
		t.Errorf("outcomes reported to the console: %q", got)
	}
	if up.Count() != 1 {
		t.Fatalf("the provider has %d batches, want 1", up.Count())
	}

	// Completion: settled from the output file at batch prices, once.
	id, _ := strings.CutSuffix(b.ID, b.ID[strings.LastIndexByte(b.ID, '~'):])
	if err := up.Complete(id); err != nil {
		t.Fatal(err)
	}
	done, err := oneB.Batches.Get(ctx, b.ID)
	if err != nil || done.Status != openai.BatchStatusCompleted || done.OutputFileID == "" {
		t.Fatalf("completed: %v %+v", err, done)
	}
	out, err := one.Files.Content(ctx, done.OutputFileID)
	if err != nil {
		t.Fatal(err)
	}
	outBody, _ := io.ReadAll(out.Body)
	out.Body.Close()
	price, _ := e.gws[0].prices.Lookup("gpt-test")
	var prompt, completion int64
	for _, l := range strings.Split(strings.TrimSpace(content), "\n")[:6] {
		var body struct{}
		_ = body
		prompt += int64(fakeopenai.CountPromptTokens([]byte(l[strings.Index(l, `"body":`)+7 : len(l)-1])))
		completion += 100
	}
	// Every third request failed and costs nothing: 4 of 6 served.
	prompt, completion = prompt*4/6, completion*4/6
	want := (int64(price.Cost(pricing.OpenAIUsage(prompt, 0, completion, 0)))*50 + 99) / 100
	if got := e.spent(clientKey, "key", "month"); int64(got) != want || strings.Count(string(outBody), "\n") != 4 {
		t.Fatalf("after completion the budget shows %s spent, want the output's usage at batch prices %s (reserved %s); output %q", got, pricing.Micros(want), reserved, outBody)
	}
	for range 2 { // settled once, on any replica
		if _, err := one.Batches.Get(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	// A client polling a finished batch, or the list, does not make the
	// gateway read its output again and again: each replica reads it at
	// most once (this one found it settled by the other).
	reads := up.Reads()
	for range 5 {
		if _, err := one.Batches.Get(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := oneB.Batches.List(ctx, openai.BatchListParams{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := up.Reads(); got != reads {
		t.Fatalf("polling a settled batch read %d more files upstream", got-reads)
	}
	if got := e.spent(clientKey, "key", "month"); int64(got) != want {
		t.Fatalf("a second look settled again: %s", got)
	}
	// The queue is free again: the big file fits now; cancelled, it gives
	// everything back.
	c, err := one.Batches.New(ctx, openai.BatchNewParams{InputFileID: big.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	if c2, err := one.Batches.Cancel(ctx, c.ID); err != nil || c2.Status != openai.BatchStatusCancelling {
		t.Fatalf("cancel: %v %+v", err, c2)
	}
	cid := c.ID[:strings.LastIndexByte(c.ID, '~')]
	if err := up.Complete(cid); err != nil {
		t.Fatal(err)
	}
	if c3, err := one.Batches.Get(ctx, c.ID); err != nil || c3.Status != openai.BatchStatusCancelled {
		t.Fatalf("cancelled: %v", err)
	}
	if got := e.spent(clientKey, "key", "month"); int64(got) != want {
		t.Fatalf("a cancelled batch left %s spent, want %s", got, pricing.Micros(want))
	}
	if e.spent(clientKey2, "key", "month") != 0 {
		t.Fatal("the other key was charged")
	}
}

// TestBatchFileChecked: bad batch files get a clear 400 naming the line
// before anything reaches the provider; other purposes and the file list
// are refused.
func TestBatchFileChecked(t *testing.T) {
	up := fakeopenai.NewBatches(t, fakeopenai.BatchOptions{APIKey: upstreamKey})
	e := newBudgetEnv(t, uniqueClients(t, batchDoc), up, fakeClockStore(t))
	ctx := context.Background()
	one := sdk(e.urls[0], clientKey)
	line := func(id, url, model string) string {
		return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":%q,"body":{"model":%q,"messages":[]}}`, id, url, model) + "\n"
	}
	for name, tc := range map[string]struct{ content, want string }{
		"not json":      {"{\n", "line 1"},
		"duplicate id":  {line("a", "/v1/chat/completions", "m") + line("a", "/v1/chat/completions", "m"), "line 2: custom_id"},
		"two models":    {line("a", "/v1/chat/completions", "m") + line("b", "/v1/chat/completions", "n"), "one model"},
		"bad endpoint":  {line("a", "/v1/images/generations", "m"), "not a batch endpoint"},
		"two endpoints": {line("a", "/v1/chat/completions", "m") + line("b", "/v1/embeddings", "m"), "one endpoint"},
		"empty":         {"\n\n", "no requests"},
	} {
		_, err := one.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader(tc.content), "x.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
		var ae *openai.Error
		if !errors.As(err, &ae) || ae.StatusCode != 400 || !strings.Contains(ae.Message, tc.want) {
			t.Errorf("%s: %v, want 400 %q", name, err, tc.want)
		}
	}
	_, err := one.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader("x"), "x.txt", "text/plain"), Purpose: openai.FilePurposeAssistants})
	apiErr(t, err, 400, "")
	req, _ := http.NewRequest(http.MethodGet, e.urls[0]+"/v1/files", nil)
	req.Header.Set("Authorization", "Bearer "+clientKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 404 {
		t.Fatalf("file list: %v %d", err, res.StatusCode)
	}
	res.Body.Close()
	if _, err := one.Batches.Get(ctx, "batch_000001~0000000000000000000000"); err == nil {
		t.Fatal("a forged id was served")
	}
	_ = sluice.HashKey
}

// TestBatchAPINodeSDK: the official OpenAI Node SDK on the Batch API
// through the gateway (testdata/nodesdk/batch.mjs).
func TestBatchAPINodeSDK(t *testing.T) {
	node, dir := nodeSDKDir(t)
	up := fakeopenai.NewBatches(t, fakeopenai.BatchOptions{APIKey: upstreamKey})
	e := newBudgetEnv(t, uniqueClients(t, batchDoc), up, fakeClockStore(t))
	script, err := os.ReadFile(filepath.Join("testdata", "nodesdk", "batch.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	out := nodesdk.Run(t, node, dir, script, "SLUICE_BASE_URL="+e.urls[0]+"/v1", "SLUICE_API_KEY="+clientKey, "SLUICE_API_KEY_2="+clientKey2)
	var res struct {
		File, Batch, Got, Status    string
		Listed                      []string
		OtherRetrieve, OtherContent int
		OtherList                   int
		Cancelled                   string
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("batch.mjs printed %q: %v", out, err)
	}
	if res.Got != res.Batch || res.Status != "validating" || len(res.Listed) != 1 || res.Listed[0] != res.Batch ||
		res.OtherRetrieve != 404 || res.OtherContent != 404 || res.OtherList != 0 || res.Cancelled != "cancelling" || up.Count() != 1 {
		t.Fatalf("node saw %+v; the provider has %d batches", res, up.Count())
	}
	if e.spent(clientKey, "key", "month") <= 0 {
		t.Fatal("the batch reserved nothing")
	}
}
