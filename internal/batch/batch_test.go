package batch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/aiclient"
	"github.com/sluice-io/sluice/internal/fakeopenai"
)

func runBatch(t *testing.T, ctx context.Context, cfg Config) *Summary {
	t.Helper()
	sum, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

func openFile(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestEveryPromptAnsweredOnce: against an upstream that answers with 429s
// (with and without Retry-After), 500s, timeouts and slow replies, every
// prompt ends up answered exactly once in the output.
func TestEveryPromptAnsweredOnce(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	var faults []fakeopenai.Fault
	for i := range 20 {
		faults = append(faults,
			fakeopenai.Fault{Status: 429, RetryAfterMS: "20"},
			fakeopenai.Fault{Status: 429},
			fakeopenai.Fault{Status: 429, RetryAfter: "0"},
			fakeopenai.Fault{Status: 500},
			fakeopenai.Fault{Status: 503},
			fakeopenai.Fault{Delay: 30 * time.Millisecond}, // slow
			fakeopenai.Fault{},
		)
		if i%5 == 0 {
			faults = append(faults, fakeopenai.Fault{Delay: time.Minute}) // times out
		}
	}
	up.Enqueue(faults...)
	dir := t.TempDir()
	const n = 150
	out := dir + "/out.jsonl"
	var progress bytes.Buffer
	sum := runBatch(t, context.Background(), Config{
		Input: openFile(t, writeInput(t, dir, "a", n)), Total: n, Output: out,
		// Faults are served in arrival order, so one prompt may meet many
		// in a row: allow more retries than there are faults.
		Client: testClient(t, up.URL(), func(o *aiclient.Options) { o.MaxRetries = len(faults) + 1 }), Model: "gpt-4o-mini", Concurrency: 8,
		Progress: &progress, ProgressInterval: 10 * time.Millisecond,
	})
	recs := readOutput(t, out)
	checkExactlyOnce(t, recs, n)
	if sum.OK != n || sum.Failed != 0 || sum.Retried == 0 || sum.Retries < int64(len(faults)-2*20) {
		t.Fatalf("summary %+v", sum)
	}
	var attempts int64
	for _, r := range recs {
		attempts += int64(r.Attempts)
		if r.Usage == nil || r.Usage.CompletionTokens != 8 || r.Response == "" {
			t.Fatalf("record %+v", r)
		}
	}
	if got := int64(up.Count()); got != attempts || got != n+sum.Retries {
		t.Fatalf("upstream saw %d requests; records say %d attempts; %d prompts + %d retries", got, attempts, n, sum.Retries)
	}
	if sum.PromptTokens == 0 || sum.CompletionTokens != 8*n {
		t.Fatalf("tokens %d + %d", sum.PromptTokens, sum.CompletionTokens)
	}
	if !strings.Contains(progress.String(), "batch progress") {
		t.Fatalf("no progress lines in %q", progress.String())
	}
}

func TestResumeSkipsDoneAndCutsTornLine(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	out := dir + "/out.jsonl"
	client := testClient(t, up.URL(), nil)
	in10 := writeInput(t, dir, "a", 10)
	runBatch(t, context.Background(), Config{Input: openFile(t, in10), Output: out, Client: client, Model: "m"})
	if up.Count() != 10 {
		t.Fatalf("first run: %d requests", up.Count())
	}
	// A torn line, as a power cut mid-write could leave.
	f, err := os.OpenFile(out, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"id":"p10","line":11,"status":"o`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	sum := runBatch(t, context.Background(), Config{Input: openFile(t, writeInput(t, dir, "b", 25)), Output: out, Client: client, Model: "m"})
	if up.Count() != 25 || sum.OK != 15 || sum.SkippedOK != 10 || sum.TornBytes == 0 {
		t.Fatalf("rerun: %d requests, summary %+v", up.Count(), sum)
	}
	checkExactlyOnce(t, readOutput(t, out), 25)
}

func TestFailedForGoodAndRetryFailed(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	up.Enqueue(fakeopenai.Fault{Status: 400})
	dir := t.TempDir()
	out := dir + "/out.jsonl"
	client := testClient(t, up.URL(), nil)
	in := writeInput(t, dir, "a", 3)
	sum := runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: client, Model: "m", Concurrency: 1})
	if sum.OK != 2 || sum.Failed != 1 || sum.FailedForGood() != 1 {
		t.Fatalf("summary %+v", sum)
	}
	recs := readOutput(t, out)
	if recs[0].ID != "p0" || recs[0].Status != StatusFailed || recs[0].HTTPStatus != 400 || recs[0].Attempts != 1 {
		t.Fatalf("first record %+v", recs[0])
	}
	// A plain rerun skips the failure and still reports it.
	sum = runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: client, Model: "m"})
	if sum.SkippedFailed != 1 || sum.SkippedOK != 2 || sum.FailedForGood() != 1 || up.Count() != 3 {
		t.Fatalf("rerun summary %+v, %d requests", sum, up.Count())
	}
	// --retry-failed calls it again; the ok line supersedes the failed one.
	sum = runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: client, Model: "m", RetryFailed: true})
	if sum.OK != 1 || sum.FailedForGood() != 0 || up.Count() != 4 {
		t.Fatalf("retry-failed summary %+v, %d requests", sum, up.Count())
	}
	_, resumed, err := OpenOutput(out, false, 100, nil)
	if err != nil || resumed.OK != 3 || resumed.Failed != 0 {
		t.Fatalf("resumed %+v, %v", resumed, err)
	}
}

// TestNoModelStopsTheRun: without --model, a prompt that names no model
// stops the run before anything is sent or written, instead of filling the
// output with failures that a rerun would skip.
func TestNoModelStopsTheRun(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	for _, input := range []string{"plain prompt\nanother\n", "{\"id\":1,\"prompt\":\"a\"}\n"} {
		in := dir + "/in.jsonl"
		if err := os.WriteFile(in, []byte(input), 0o644); err != nil {
			t.Fatal(err)
		}
		out := dir + "/out.jsonl"
		sum, err := Run(context.Background(), Config{Input: openFile(t, in), Output: out, Client: testClient(t, up.URL(), nil), Concurrency: 1})
		if !errors.Is(err, ErrNoModel) || !strings.Contains(err.Error(), "--model") || !strings.Contains(err.Error(), "line 1") {
			t.Fatalf("%q: err %v", input, err)
		}
		if sum.OK+sum.Failed != 0 || up.Count() != 0 || len(readOutput(t, out)) != 0 {
			t.Fatalf("%q: summary %+v, %d requests", input, sum, up.Count())
		}
	}
}

// TestRerunNamesRetryFailed: a rerun that skips failures says how to
// retry them, in the log and in the summary.
func TestRerunNamesRetryFailed(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	up.Enqueue(fakeopenai.Fault{Status: 400})
	dir := t.TempDir()
	out := dir + "/out.jsonl"
	in := writeInput(t, dir, "a", 2)
	runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: testClient(t, up.URL(), nil), Model: "m", Concurrency: 1})
	var log, text bytes.Buffer
	sum := runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: testClient(t, up.URL(), nil), Model: "m", Logger: slog.New(slog.NewTextHandler(&log, nil))})
	_ = sum.Write(&text)
	for _, out := range []string{log.String(), text.String()} {
		if !strings.Contains(out, "--retry-failed") {
			t.Errorf("no mention of --retry-failed:\n%s", out)
		}
	}
	if !strings.Contains(text.String(), "1 already failed (not called again") {
		t.Errorf("summary:\n%s", text.String())
	}
}

// TestDuplicatesCompleteTheBar: a duplicate id counts as handled, so the
// bar ends at 100 % and nothing is left.
func TestDuplicatesCompleteTheBar(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	in := dir + "/in.jsonl"
	if err := os.WriteFile(in, []byte("{\"id\":\"a\",\"prompt\":\"1\"}\n{\"id\":\"b\",\"prompt\":\"2\"}\n{\"id\":\"a\",\"prompt\":\"3\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := openFile(t, in)
	total, err := CountPrompts(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	var bar bytes.Buffer
	sum := runBatch(t, context.Background(), Config{Input: f, Total: total, Output: dir + "/out.jsonl", Client: testClient(t, up.URL(), nil), Model: "m",
		Progress: &bar, TTY: true, Logger: slog.New(slog.DiscardHandler)})
	if sum.Duplicates != 1 || sum.OK != 2 || sum.Left != 0 {
		t.Fatalf("summary %+v", sum)
	}
	lines := strings.Split(strings.TrimSpace(bar.String()), "\r\x1b[K")
	if last := lines[len(lines)-1]; !strings.Contains(last, "100% 2/2") {
		t.Fatalf("last bar %q", last)
	}
}

func TestBadLinesAreFailedRecords(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	in := dir + "/in.jsonl"
	if err := os.WriteFile(in, []byte("plain prompt\n\n{\"id\":7,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n{not json\n{\"id\":\"x\"}\n{\"id\":\"p\",\"prompt\":\"a\"}\n{\"id\":\"p\",\"prompt\":\"dup\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := dir + "/out.jsonl"
	sum := runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: testClient(t, up.URL(), nil), Model: "m", Concurrency: 1})
	if sum.OK != 3 || sum.Failed != 2 || sum.Duplicates != 1 || up.Count() != 3 {
		t.Fatalf("summary %+v, %d requests", sum, up.Count())
	}
	byID := map[string]Record{}
	for _, r := range readOutput(t, out) {
		byID[r.ID] = r
	}
	if byID["line-1"].Status != StatusOK || byID["7"].Status != StatusOK || byID["line-4"].Status != StatusFailed || byID["x"].Status != StatusFailed || byID["p"].Status != StatusOK {
		t.Fatalf("records %+v", byID)
	}
}

// TestInterruptFinishesInFlight: cancelling stops launching; the calls in
// flight finish within the grace period and are written; a rerun does the
// rest, each prompt once.
func TestInterruptFinishesInFlight(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{Default: fakeopenai.Fault{Delay: 100 * time.Millisecond}})
	g := newGate(t, up.URL(), 6)
	dir := t.TempDir()
	out := dir + "/out.jsonl"
	in := writeInput(t, dir, "a", 40)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-g.Reached; cancel() }()
	sum := runBatch(t, ctx, Config{Input: openFile(t, in), Total: 40, Output: out, Client: testClient(t, g.URL, nil), Model: "m", Concurrency: 4, Grace: 10 * time.Second})
	recs := readOutput(t, out)
	// Every request sent was answered and written: none was cut off. (A
	// prompt a worker had taken but not yet sent counts as unfinished.)
	if !sum.Interrupted || int(sum.OK) != len(recs) || len(recs) != up.Count() || len(recs) >= 40 {
		t.Fatalf("summary %+v, %d records, %d requests", sum, len(recs), up.Count())
	}
	// What is left is every prompt not written, whether a worker had it
	// or it was never read.
	if sum.Left != 40-int64(len(recs)) {
		t.Fatalf("left %d, want %d", sum.Left, 40-len(recs))
	}
	var text bytes.Buffer
	_ = sum.Write(&text)
	if want := fmt.Sprintf("%d left for a rerun with the same --output", 40-len(recs)); !strings.Contains(text.String(), want) {
		t.Errorf("summary lacks %q:\n%s", want, text.String())
	}
	runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: testClient(t, g.URL, nil), Model: "m", Concurrency: 4})
	checkExactlyOnce(t, readOutput(t, out), 40)
	if up.Count() != 40 {
		t.Fatalf("%d requests for 40 prompts", up.Count())
	}
}

// TestGraceExpires: calls still in flight when the grace period ends are
// abandoned and not written.
func TestGraceExpires(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{Default: fakeopenai.Fault{Delay: time.Minute}})
	g := newGate(t, up.URL(), 3)
	dir := t.TempDir()
	out := dir + "/out.jsonl"
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-g.Reached; cancel() }()
	start := time.Now()
	sum := runBatch(t, ctx, Config{
		Input: openFile(t, writeInput(t, dir, "a", 10)), Output: out, Model: "m", Concurrency: 3, Grace: 50 * time.Millisecond,
		Client: testClient(t, g.URL, func(o *aiclient.Options) { o.AttemptTimeout = 0 }),
	})
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("took %v", d)
	}
	if !sum.Interrupted || sum.Unfinished != 3 || len(readOutput(t, out)) != 0 {
		t.Fatalf("summary %+v", sum)
	}
}

func TestOutputLocked(t *testing.T) {
	path := t.TempDir() + "/out.jsonl"
	o, _, err := OpenOutput(path, true, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, _, err := OpenOutput(path, true, 10, nil); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second open: %v", err)
	}
}

func TestOutputRejectsForeignFile(t *testing.T) {
	path := t.TempDir() + "/out.jsonl"
	if err := os.WriteFile(path, []byte("{\"id\":\"a\",\"status\":\"ok\"}\nhello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenOutput(path, true, 10, nil); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("err = %v", err)
	}
	if b, _ := os.ReadFile(path); !bytes.HasSuffix(b, []byte("hello\n")) {
		t.Fatal("a foreign file was modified")
	}
}

func TestTooManyIDs(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	_, err := Run(context.Background(), Config{Input: openFile(t, writeInput(t, dir, "a", 5)), Output: dir + "/o", Client: testClient(t, up.URL(), nil), Model: "m", MaxIDs: 3})
	if !errors.Is(err, ErrTooManyIDs) {
		t.Fatalf("err = %v", err)
	}
}

func TestReader(t *testing.T) {
	in := strings.Join([]string{
		"  hello world  ",
		"",
		`{"id":"a","prompt":"p","system":"be brief","model":"x","max_tokens":5,"temperature":0.2}`,
		`{"id":12,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
		`{"prompt":"p","messages":[]}`,
		`{"id":"","prompt":"p"}`,
		`{"prompt":""}`,
		`{"max_tokens":-1,"prompt":"p"}`,
	}, "\n")
	r := NewReader(strings.NewReader(in), "def", 99, 0)
	var got []Prompt
	for {
		p, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p)
	}
	if len(got) != 7 {
		t.Fatalf("%d prompts", len(got))
	}
	if p := got[0]; p.ID != "line-1" || p.Err != nil || p.Request.Model != "def" || p.Request.MaxTokens != 99 || p.Request.Messages[0].Content != "hello world" {
		t.Fatalf("plain: %+v", p)
	}
	if p := got[1]; p.ID != "a" || p.Line != 3 || p.Err != nil || p.Request.Model != "x" || p.Request.MaxTokens != 5 ||
		len(p.Request.Messages) != 2 || p.Request.Messages[0].Role != "system" || string(p.Request.Params["temperature"]) != "0.2" {
		t.Fatalf("jsonl: %+v", p)
	}
	if p := got[2]; p.ID != "12" || p.Err != nil || len(p.Request.Messages[0].Parts) == 0 {
		t.Fatalf("parts: %+v", p)
	}
	for i, p := range got[3:] {
		if p.Err == nil {
			t.Errorf("bad line %d accepted: %+v", i+5, p)
		}
	}
	// A line over the bound is a failed prompt of its own, line-N, and the
	// lines after it are read (TestOverlongLineIsAFailedRecord).
	r = NewReader(strings.NewReader(strings.Repeat("x", 100)+"\nok\n"), "m", 0, 50)
	if p, err := r.Next(); err != nil || p.Err == nil || p.ID != "line-1" {
		t.Fatalf("long line: %+v %v", p, err)
	}
	if p, err := r.Next(); err != nil || p.Err != nil || p.ID != "line-2" || p.Request.Messages[0].Content != "ok" {
		t.Fatalf("the line after a long one: %+v %v", p, err)
	}
}

func TestCountPrompts(t *testing.T) {
	n, err := CountPrompts(strings.NewReader("a\n\n  \nb\r\n" + strings.Repeat("c", 300<<10) + "\nlast"))
	if err != nil || n != 4 {
		t.Fatalf("CountPrompts = %d, %v", n, err)
	}
}

func TestPrices(t *testing.T) {
	p := DefaultPrices()
	if c, ok := p.Cost("deepseek-v3.2", 1_000_000, 1_000_000); !ok || c != 0.84 {
		t.Fatalf("cost %v %v", c, ok)
	}
	if err := p.Set("mine=1/2"); err != nil {
		t.Fatal(err)
	}
	if c, _ := p.Cost("mine", 500_000, 1_000_000); c != 2.5 {
		t.Fatalf("cost %v", c)
	}
	for _, bad := range []string{"x", "=1", "m=-1", "m=NaN", "m=1/x"} {
		if err := p.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	path := t.TempDir() + "/p.json"
	_ = os.WriteFile(path, []byte(`{"gpt-4.1":{"input":2,"output":8}}`), 0o644)
	if err := p.LoadPrices(path); err != nil || p["gpt-4.1"].Output != 8 {
		t.Fatalf("LoadPrices: %v %+v", err, p["gpt-4.1"])
	}
	_ = os.WriteFile(path, []byte(`{"m":{"inptu":2}}`), 0o644)
	if err := p.LoadPrices(path); err == nil {
		t.Fatal("unknown field accepted")
	}
}

// TestExampleModelsHavePrices: every model the examples and docs name has
// a default price, so the summary of a run copied from them has a cost.
func TestExampleModelsHavePrices(t *testing.T) {
	prices := DefaultPrices()
	re := regexp.MustCompile(`(?:--model |"model": ?"|models: \[)([A-Za-z0-9._, -]+)`)
	for _, f := range []string{"../../examples/gateway.yaml", "../../docs/batch.md", "../../docs/gateway.md", "../../README.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			for _, model := range strings.Split(m[1], ",") {
				model = strings.TrimSpace(model)
				if model == "" || model == "..." {
					continue
				}
				if _, ok := prices[model]; !ok {
					t.Errorf("%s names model %q, which has no default price", f, model)
				}
			}
		}
	}
}
