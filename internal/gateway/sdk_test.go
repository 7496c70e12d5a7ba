package gateway

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
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

// sdkEnv runs the gateway on the system clock, for the official SDK whose
// retry loop waits in real time.
func sdkEnv(t *testing.T, l Limits) (*env, *prometheus.Registry, openai.Client) {
	t.Helper()
	st, err := memstore.New(memstore.Options{Clock: clock.NewSystem()})
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
	client := openai.NewClient(option.WithBaseURL(e.srv.URL+"/v1/"), option.WithAPIKey(clientKey), option.WithMaxRetries(2))
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
	e, _, client := sdkEnv(t, Limits{RPM: 1000, TPM: 100000})
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
// request is denied for ~100ms; the SDK's retry loop waits what our
// retry-after-ms says and then gets through.
func TestOfficialSDKRetriesAsTold(t *testing.T) {
	e, _, client := sdkEnv(t, Limits{RPM: 600, RPMBurst: 1, TPM: 100000})
	ctx := context.Background()
	if _, err := client.Chat.Completions.New(ctx, chatParams(5)); err != nil {
		t.Fatal(err)
	}
	e.settle()
	if _, err := client.Chat.Completions.New(ctx, chatParams(5)); err != nil {
		t.Fatalf("the SDK did not get through after waiting: %v", err)
	}
	e.settle()
	if got := counterValue(t, e.gw.metrics.rejections.WithLabelValues("t", "gpt-test", "rpm")); got < 1 {
		t.Fatalf("no rpm rejection recorded (%v): the retry was not exercised", got)
	}
	reqs := e.up.Requests()
	if len(reqs) != 2 {
		t.Fatalf("upstream saw %d requests", len(reqs))
	}
	// The retried request reached the upstream no earlier than the limit
	// allows: 100ms after the first, less the first one's own way there.
	if gap := reqs[1].Time.Sub(reqs[0].Time); gap < 95*time.Millisecond {
		t.Fatalf("retry came after %s, before the 100ms the limit needs", gap)
	}
	if reqs[1].Header.Get("X-Stainless-Retry-Count") == "0" {
		t.Fatalf("second upstream request was not a retry: %v", reqs[1].Header)
	}
}

func TestOfficialSDKDoesNotRetryTooLarge(t *testing.T) {
	e, _, client := sdkEnv(t, Limits{TPM: 100})
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
