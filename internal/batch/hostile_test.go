package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/aiclient"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
)

// TestHugeAnswerStaysResumable: an answer of 11 MiB of '<' (code, HTML:
// any text heavy in <, > and &) fits the client's 16 MiB response bound.
// Its record must be readable when the output is resumed: json.Marshal's
// HTML escaping wrote each '<' as 6 bytes, a 66 MiB line over the 64 MiB
// a resume reads, so every rerun refused the output.
func TestHugeAnswerStaysResumable(t *testing.T) {
	answer := strings.Repeat("<", 11<<20)
	body, err := json.Marshal(map[string]any{
		"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": answer}, "finish_reason": "stop"}},
		"usage":   map[string]any{"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
	})
	if err != nil {
		t.Fatal(err)
	}
	body = []byte(strings.ReplaceAll(string(body), `\u003c`, "<")) // as a server sends it
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	out := dir + "/out.jsonl"
	client := testClient(t, srv.URL, func(o *aiclient.Options) { o.AttemptTimeout = time.Minute })
	if sum := runBatch(t, context.Background(), Config{Input: openFile(t, writeInput(t, dir, "a", 2)), Output: out, Client: client, Model: "m"}); sum.OK != 2 {
		t.Fatalf("first run: %+v", sum)
	}
	first := calls.Load()
	sum, err := Run(context.Background(), Config{Input: openFile(t, writeInput(t, dir, "a", 2)), Output: out, Client: client, Model: "m"})
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if sum.SkippedOK != 2 || calls.Load() != first {
		t.Fatalf("resume: summary %+v, upstream %d; want both skipped", sum, calls.Load())
	}
}

// TestOutputChangedUnderneath: another process replaces the output while
// the run goes on (an editor saving it writes a new file and renames it
// over the old one) or truncates it. Before, the run wrote its records on
// into the replaced file, gone with it, or past the new end, leaving a run
// of NUL bytes that a resume refused; and it reported every prompt done.
// Now the run stops with ErrOutputChanged at the first record it would
// lose, every prompt it counts as answered has its record at --output,
// and a rerun completes the rest, each prompt exactly once.
func TestOutputChangedUnderneath(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, path string)
	}{
		{"replaced", func(t *testing.T, path string) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Error(err)
				return
			}
			if err := os.WriteFile(path+".new", data, 0o644); err != nil {
				t.Error(err)
			}
			if err := os.Rename(path+".new", path); err != nil {
				t.Error(err)
			}
		}},
		{"removed", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Error(err)
			}
		}},
		{"truncated", func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Error(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out := dir + "/out.jsonl"
			up := fakeopenai.New(t, fakeopenai.Options{})
			var calls atomic.Int64
			// The 4th call changes the output before it is answered: the
			// first three records are written by then (one call at a time).
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 4 {
					tc.change(t, out)
				}
				resp, err := http.Post(up.URL()+r.URL.Path, "application/json", r.Body)
				if err != nil {
					t.Error(err)
					return
				}
				defer resp.Body.Close()
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(resp.StatusCode)
				_, _ = io.Copy(w, resp.Body)
			}))
			t.Cleanup(srv.Close)
			client := testClient(t, srv.URL, nil)
			const n = 10
			in := writeInput(t, dir, "a", n)
			sum, err := Run(context.Background(), Config{Input: openFile(t, in), Output: out, Client: client, Model: "m", Concurrency: 1})
			if !errors.Is(err, ErrOutputChanged) {
				t.Fatalf("run: err %v, want ErrOutputChanged", err)
			}
			var recs []Record
			if _, serr := os.Stat(out); serr == nil {
				recs = readOutput(t, out)
			}
			if tc.name != "replaced" {
				recs = nil // the records of before the change went with it
			}
			if sum.OK != 3 || len(recs) != 0 && len(recs) != 3 {
				t.Fatalf("run: %d ok, %d records at --output; want 3 and 3", sum.OK, len(recs))
			}
			if tc.name == "replaced" {
				// The rerun takes the new file's lock and does the rest.
				runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: client, Model: "m"})
				checkExactlyOnce(t, readOutput(t, out), n)
			}
		})
	}
}

// TestLimiterFailureStopsTheRun: Redis dies mid-batch under the failure
// policy "error" (--redis-policy error). Before, every prompt left was
// recorded as failed within milliseconds, unsent, and a plain rerun
// skipped them all as failed for good. A limiter that fails is the run's
// trouble, not the prompt's: the run now stops with the error, the
// prompts not sent get no record, and a rerun once Redis is back does
// them, each exactly once.
func TestLimiterFailureStopsTheRun(t *testing.T) {
	rs := redistest.NewStandalone(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	// limited returns a request limiter on rs, as a new process has.
	limited := func() *sluice.Limiter {
		store, err := redisstore.New(ctx, redisstore.Options{URL: rs.URL()})
		if err != nil {
			t.Fatal(err)
		}
		g, err := guard.New(store, guard.Options{Policy: guard.ReturnError, Logger: slog.New(slog.DiscardHandler), CloseStore: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		reqs, err := sluice.NewLimiter(sluice.Options{Store: g, Limit: sluice.PerSecond(1000), Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		return reqs
	}
	up := fakeopenai.New(t, fakeopenai.Options{})
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 5 {
			rs.Kill() // before the 5th answer: the 6th prompt meets it
		}
		resp, err := http.Post(up.URL()+r.URL.Path, "application/json", r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	client := testClient(t, srv.URL, func(o *aiclient.Options) { o.Requests = limited() })
	dir := t.TempDir()
	const n = 20
	in, out := writeInput(t, dir, "a", n), dir+"/out.jsonl"
	sum, err := Run(ctx, Config{Input: openFile(t, in), Output: out, Client: client, Model: "m", Concurrency: 1})
	if !errors.Is(err, aiclient.ErrLimiter) {
		t.Fatalf("run: err %v, want the limiter's error", err)
	}
	if recs := readOutput(t, out); sum.OK != 5 || sum.Failed != 0 || len(recs) != 5 {
		t.Fatalf("run: %d ok, %d failed, %d records; want 5, 0, 5", sum.OK, sum.Failed, len(recs))
	}
	rs.Restart(t)
	client = testClient(t, srv.URL, func(o *aiclient.Options) { o.Requests = limited() })
	sum = runBatch(t, ctx, Config{Input: openFile(t, in), Output: out, Client: client, Model: "m"})
	if sum.OK != n-5 || sum.SkippedOK != 5 || calls.Load() != n {
		t.Fatalf("rerun: summary %+v, upstream %d", sum, calls.Load())
	}
	checkExactlyOnce(t, readOutput(t, out), n)
}

// TestInvalidUTF8IDsNotMerged: two ids that differ only in bytes that are
// not UTF-8 ("a\xff", "a\xfe") both decoded to "a\uFFFD": the second
// prompt was skipped as a duplicate of the first, never answered. Such an
// id cannot be written back as it was read either (a resume would not
// find it), so each such line is now a failed record of its own, named
// line-N, that says why, and nothing is sent for it (as for any line that
// is not UTF-8 text).
func TestInvalidUTF8IDsNotMerged(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	in := dir + "/in.jsonl"
	if err := os.WriteFile(in, []byte("{\"id\":\"a\xff\",\"prompt\":\"one\"}\n{\"id\":\"a\xfe\",\"prompt\":\"two\"}\n{\"id\":\"b\",\"prompt\":\"three\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := dir + "/out.jsonl"
	sum := runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: testClient(t, up.URL(), nil), Model: "m", Concurrency: 1})
	if sum.Duplicates != 0 || sum.OK != 1 || sum.Failed != 2 || up.Count() != 1 {
		t.Fatalf("summary %+v, %d requests", sum, up.Count())
	}
	byID := map[string]Record{}
	for _, r := range readOutput(t, out) {
		byID[r.ID] = r
	}
	for _, id := range []string{"line-1", "line-2"} {
		if r := byID[id]; r.Status != StatusFailed || !strings.Contains(r.Error, "UTF-8") {
			t.Errorf("%s: %+v", id, r)
		}
	}
}

// TestLastRecordWithoutNewlineKept: an output whose last record lacks only
// its newline (rewritten by a script that joins lines with "\n", or an
// editor that drops the final newline) was taken for a torn line and cut
// off: that answer was lost and its prompt paid for again. A last line
// that is a whole record is kept now, its newline added.
func TestLastRecordWithoutNewlineKept(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	out := dir + "/out.jsonl"
	client := testClient(t, up.URL(), nil)
	in := writeInput(t, dir, "a", 5)
	runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: client, Model: "m"})
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, []byte(strings.TrimRight(string(data), "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := runBatch(t, context.Background(), Config{Input: openFile(t, writeInput(t, dir, "b", 8)), Output: out, Client: client, Model: "m"})
	if sum.SkippedOK != 5 || sum.OK != 3 || sum.TornBytes != 0 || up.Count() != 8 {
		t.Fatalf("rerun: summary %+v, upstream %d", sum, up.Count())
	}
	checkExactlyOnce(t, readOutput(t, out), 8)
}

// TestNonTextLinesNotSent: lines that are not UTF-8 text (a Latin-1 file,
// a compressed or binary file passed by mistake: NUL bytes, invalid UTF-8)
// were sent, and paid for, with U+FFFD in place of every bad byte: a
// prompt the user never wrote. They are failed records now, unsent.
func TestNonTextLinesNotSent(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	in := dir + "/in.jsonl"
	if err := os.WriteFile(in, []byte("caf\xe9 au lait\nbin\x00ary\n{\"id\":\"j\",\"prompt\":\"caf\xe9\"}\n{\"id\":\"ok\",\"prompt\":\"caf\u00e9\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := dir + "/out.jsonl"
	sum := runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: testClient(t, up.URL(), nil), Model: "m", Concurrency: 1})
	if sum.OK != 1 || sum.Failed != 3 || up.Count() != 1 {
		t.Fatalf("summary %+v, %d requests", sum, up.Count())
	}
	for _, r := range readOutput(t, out) {
		if r.ID != "ok" && (r.Status != StatusFailed || !strings.Contains(r.Error, "not UTF-8 text")) {
			t.Errorf("%+v", r)
		}
	}
}

// TestBOMFirstLine: a file saved with a UTF-8 byte order mark (Windows
// editors) made its first JSON line a plain-text prompt: the JSON itself
// was sent as the prompt, under the id line-1 instead of its own.
func TestBOMFirstLine(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	in := dir + "/in.jsonl"
	if err := os.WriteFile(in, []byte("\uFEFF{\"id\":\"q1\",\"prompt\":\"hello\"}\n{\"id\":\"q2\",\"prompt\":\"world\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := dir + "/out.jsonl"
	runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: testClient(t, up.URL(), nil), Model: "m", Concurrency: 1})
	ids := map[string]bool{}
	for _, r := range readOutput(t, out) {
		ids[r.ID] = r.Status == StatusOK
	}
	if !ids["q1"] || !ids["q2"] || len(ids) != 2 {
		t.Fatalf("records %v", ids)
	}
	if body := string(up.Requests()[0].Body); strings.Contains(body, `id`) {
		t.Fatalf("first request sent the JSON line as the prompt: %s", body)
	}
}

// TestInterruptWithStalledInput: prompts piped in by a producer that
// stalls (`tail -f prompts.jsonl | sluice batch --input -`). Ctrl-C
// stopped the calls but not the run, which sat in a read of the input
// until the producer wrote another line: no summary, no exit, and a second
// Ctrl-C did nothing either. The run returns now, the calls in flight
// written.
func TestInterruptWithStalledInput(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	g := newGate(t, up.URL(), 3)
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	go func() {
		for i := range 3 {
			if _, err := fmt.Fprintf(pw, "{\"id\":\"p%d\",\"prompt\":\"x\"}\n", i); err != nil {
				return
			}
		}
		// and nothing more, for now
	}()
	dir := t.TempDir()
	out := dir + "/out.jsonl"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		sum *Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, err := Run(ctx, Config{Input: pr, Output: out, Client: testClient(t, g.URL, nil), Model: "m", Concurrency: 4})
		done <- result{sum, err}
	}()
	<-g.Reached
	cancel()
	select {
	case r := <-done:
		if r.err != nil || !r.sum.Interrupted {
			t.Fatalf("run: err %v, summary %+v", r.err, r.sum)
		}
	case <-time.After(20 * time.Second): // a guard against the hang, not a timing
		t.Fatal("the run does not return after its context is cancelled while the input blocks")
	}
	checkExactlyOnce(t, readOutput(t, out), 3)
}

// TestToolCallsRecorded: prompts with "tools" (passed through) are
// answered with tool calls and no text, or, with structured outputs, with
// a refusal. The record kept only the text: status ok, response empty, the
// answer lost, and never asked again. The record keeps them now.
func TestToolCallsRecorded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(body), "refuse") {
			_, _ = io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`)
			return
		}
		_, _ = io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	in := dir + "/in.jsonl"
	if err := os.WriteFile(in, []byte(`{"id":"w","prompt":"weather in Paris?","tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`+"\n"+`{"id":"r","prompt":"refuse this"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := dir + "/out.jsonl"
	runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: testClient(t, srv.URL, nil), Model: "m", Concurrency: 1})
	byID := map[string]Record{}
	for _, r := range readOutput(t, out) {
		byID[r.ID] = r
	}
	if w := byID["w"]; !strings.Contains(string(w.ToolCalls), `"get_weather"`) || !strings.Contains(string(w.ToolCalls), `Paris`) || w.FinishReason != "tool_calls" {
		t.Errorf("tool call record: %+v", w)
	}
	if r := byID["r"]; r.Refusal != "I can't help with that." {
		t.Errorf("refusal record: %+v", r)
	}
}

// TestEveryChoiceRecorded: a prompt with "n": 3 (passed through) is
// answered, and paid, three times; the record kept the first choice only.
// The others are in the record now.
func TestEveryChoiceRecorded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"one"},"finish_reason":"stop"},{"index":1,"message":{"role":"assistant","content":"two"},"finish_reason":"length"},{"index":2,"message":{"role":"assistant","content":"three"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":15,"total_tokens":18}}`)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	in := dir + "/in.jsonl"
	if err := os.WriteFile(in, []byte(`{"id":"n3","prompt":"count","n":3}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := dir + "/out.jsonl"
	runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: testClient(t, srv.URL, nil), Model: "m"})
	recs := readOutput(t, out)
	if len(recs) != 1 || recs[0].Response != "one" || len(recs[0].OtherChoices) != 2 {
		t.Fatalf("records %+v", recs)
	}
	for i, want := range []string{"two", "three"} {
		if c := recs[0].OtherChoices[i]; c.Response != want {
			t.Errorf("choice %d: %+v, want %q", i+1, c, want)
		}
	}
	if recs[0].OtherChoices[0].FinishReason != "length" {
		t.Errorf("choice 1: %+v", recs[0].OtherChoices[0])
	}
}

// TestOverlongLineIsAFailedRecord: a line longer than MaxLineBytes ended
// the input with an error, and every rerun stopped at the same line: the
// prompts after it were never answered. It is now a failed record of its
// own, line-N, that says why (raise --max-line-bytes and --retry-failed),
// and the run goes on; a rerun sends nothing again.
func TestOverlongLineIsAFailedRecord(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	in := dir + "/in.jsonl"
	long := `{"id":"big","prompt":"` + strings.Repeat("x", 300) + `"}`
	if err := os.WriteFile(in, []byte(`{"id":"a","prompt":"one"}`+"\n"+long+"\n"+`{"id":"b","prompt":"two"}`+"\r\nthree"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := dir + "/out.jsonl"
	run := func() *Summary {
		return runBatch(t, context.Background(), Config{Input: openFile(t, in), Output: out, Client: testClient(t, up.URL(), nil), Model: "m", Concurrency: 1, MaxLineBytes: 200})
	}
	if sum := run(); sum.OK != 3 || sum.Failed != 1 || up.Count() != 3 {
		t.Fatalf("summary %+v, %d requests", sum, up.Count())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"id":"line-2"`) || !strings.Contains(string(data), "longer than") {
		t.Fatalf("no failed record for line 2 that says why:\n%s", data)
	}
	if sum := run(); sum.OK != 0 || up.Count() != 3 {
		t.Fatalf("rerun: %+v, %d requests", sum, up.Count())
	}
}
