package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/memstore"
)

// sdkEnv runs the gateway on clk (the system clock when nil) for the
// official SDK, whose retry loop waits in real time; opts go to the SDK
// client.
func sdkEnv(t *testing.T, l Limits, clk clock.Clock, opts ...option.RequestOption) (*env, *prometheus.Registry, openai.Client) {
	t.Helper()
	if clk == nil {
		clk = clock.NewSystem()
	}
	st, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	e := newEnvStore(t, l, fakeopenai.Options{CompletionTokens: 6}, st, nil)
	reg := prometheus.NewRegistry()
	gw, err := New(Options{Config: e.cfg, Store: st, Registerer: reg, Getenv: func(string) string { return upstreamKey },
		OnSettled: func(s Settlement) { e.settled <- s }})
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Close()
	e.gw = gw
	e.srv = httptest.NewServer(gw)
	t.Cleanup(e.srv.Close)
	client := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(e.srv.URL + "/v1/"), option.WithAPIKey(clientKey), option.WithMaxRetries(2)}, opts...)...)
	return e, reg, client
}

func chatParams(maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     "gpt-test",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello from the official SDK")},
		MaxTokens: openai.Int(maxTokens),
	}
}

func TestOfficialSDK(t *testing.T) {
	e, _, client := sdkEnv(t, Limits{RPM: 1000, TPM: 100000}, nil)
	ctx := context.Background()
	resp, err := client.Chat.Completions.New(ctx, chatParams(20))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != strings.Repeat("tok ", 6) || resp.Usage.CompletionTokens != 6 {
		t.Fatalf("response %+v", resp)
	}
	if s := e.settle(); s.Actual != resp.Usage.TotalTokens {
		t.Fatalf("settled %d, usage %d", s.Actual, resp.Usage.TotalTokens)
	}

	params := chatParams(20)
	params.StreamOptions.IncludeUsage = openai.Bool(true)
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Choices[0].Message.Content != strings.Repeat("tok ", 6) || acc.Usage.CompletionTokens != 6 {
		t.Fatalf("stream %q usage %+v", acc.Choices[0].Message.Content, acc.Usage)
	}
	if s := e.settle(); s.Actual != acc.Usage.TotalTokens {
		t.Fatalf("settled %d, usage %d", s.Actual, acc.Usage.TotalTokens)
	}
	emb, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "text-embedding-3-small",
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("embed me")}})
	if err != nil || len(emb.Data) != 1 {
		t.Fatalf("embeddings: %v", err)
	}
	e.settle()
	models, err := client.Models.List(ctx)
	if err != nil || len(models.Data) == 0 {
		t.Fatalf("models: %v", err)
	}
}

// TestOfficialSDKRetriesAsTold: at 600/min with a burst of 1 the second
// request is denied for 100ms; the SDK's retry loop waits what our
// retry-after-ms says and then gets through. The limiter runs on a fake
// clock that a middleware in the SDK moves on by the retry-after-ms of each
// 429 it sees, so the denial does not depend on how fast the machine runs
// the first request, and a retry-after-ms shorter than the limit needs
// gets the retry denied again (the SDK then gives up and the test fails).
func TestOfficialSDKRetriesAsTold(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	type told struct {
		wait time.Duration // the 429's retry-after-ms
		at   time.Time     // when the SDK got it
	}
	var (
		mu       sync.Mutex
		tolds    []told
		attempts []time.Time
	)
	waitTold := func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		mu.Lock()
		attempts = append(attempts, time.Now())
		mu.Unlock()
		res, err := next(req)
		if err != nil || res.StatusCode != http.StatusTooManyRequests {
			return res, err
		}
		ms, perr := strconv.ParseInt(res.Header.Get("retry-after-ms"), 10, 64)
		if perr != nil {
			t.Errorf("429 without a retry-after-ms: %v", res.Header)
			return res, err
		}
		mu.Lock()
		tolds = append(tolds, told{time.Duration(ms) * time.Millisecond, time.Now()})
		mu.Unlock()
		clk.Advance(time.Duration(ms) * time.Millisecond)
		return res, err
	}
	e, _, client := sdkEnv(t, Limits{RPM: 600, RPMBurst: 1, TPM: 100000}, clk, option.WithMiddleware(waitTold))
	ctx := context.Background()
	if _, err := client.Chat.Completions.New(ctx, chatParams(5)); err != nil {
		t.Fatal(err)
	}
	e.settle()
	if _, err := client.Chat.Completions.New(ctx, chatParams(5)); err != nil {
		t.Fatalf("the SDK did not get through after waiting: %v", err)
	}
	e.settle()
	if got := counterValue(t, e.gw.metrics.rejections.WithLabelValues("t", "gpt-test", "rpm")); got != 1 {
		t.Fatalf("%v rpm rejections recorded, want 1 (the retry was not exercised, or was denied again)", got)
	}
	mu.Lock()
	defer mu.Unlock()
	// The clock stood still since the first admission: the limit needs
	// exactly 100ms more, and the gateway said so.
	if len(tolds) != 1 || tolds[0].wait != 100*time.Millisecond {
		t.Fatalf("told %+v, want one 429 saying 100ms", tolds)
	}
	// The SDK waited what it was told before it tried again.
	if len(attempts) != 3 {
		t.Fatalf("%d attempts, want 3", len(attempts))
	}
	if gap := attempts[2].Sub(tolds[0].at); gap < tolds[0].wait {
		t.Fatalf("retry sent %s after the 429, before the %s it was told", gap, tolds[0].wait)
	}
	reqs := e.up.Requests()
	if len(reqs) != 2 {
		t.Fatalf("upstream saw %d requests", len(reqs))
	}
	if reqs[1].Header.Get("X-Stainless-Retry-Count") == "0" {
		t.Fatalf("second upstream request was not a retry: %v", reqs[1].Header)
	}
}

func TestOfficialSDKDoesNotRetryTooLarge(t *testing.T) {
	e, _, client := sdkEnv(t, Limits{TPM: 100}, nil)
	_, err := client.Chat.Completions.New(context.Background(), chatParams(500))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Code != "request_too_large" {
		t.Fatalf("err %v", err)
	}
	if got := counterValue(t, e.gw.metrics.rejections.WithLabelValues("t", "gpt-test", "too_large")); got != 1 {
		t.Fatalf("the SDK sent the too-large request %v times, want 1", got)
	}
	if e.up.Count() != 0 {
		t.Fatal("too-large request reached upstream")
	}
	_ = sluice.HashKey
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
