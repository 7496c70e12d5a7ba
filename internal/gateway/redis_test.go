package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestParallelTPMRedisTwoInstances: 50 parallel requests from one key,
// spread over two gateway instances that share a real Redis, never admit
// more tokens than the TPM limit.
func TestParallelTPMRedisTwoInstances(t *testing.T) {
	parallelTPMRedis(t, redistest.Standalone(t).URL())
}

// TestParallelTPMRedisCluster: the same on a 3-master Redis Cluster; a
// client's keys share a hash tag, so its admission stays one atomic call.
func TestParallelTPMRedisCluster(t *testing.T) {
	parallelTPMRedis(t, redistest.SharedCluster(t).URL())
}

func parallelTPMRedis(t *testing.T, url string) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	client := strings.NewReplacer(":", "", "/", "").Replace(redistest.Prefix(t))
	client = client[len(client)-6:] + "c"
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, CompletionTokens: 100})
	l := Limits{TPM: 2000, Concurrency: 50}
	var envs []*env
	for range 2 {
		// Each instance has its own connection, as two processes would.
		// The deadline is generous: a starved machine under -race took
		// over 1s for a call and answered 503, which is not what this
		// test is about.
		st, err := redisstore.New(context.Background(), redisstore.Options{
			URL: url, Clock: clk, DisableDenyCache: true, Timeout: 10 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		envs = append(envs, newEnvUpstream(t, l, up, st, clk, client))
	}
	envs[1].settled = envs[0].settled
	parallelTPM(t, envs, l)
}

// TestRedisDownFailsClosed: with Redis gone the gateway answers 503
// rather than admitting on per-instance limits.
func TestRedisDownFailsClosed(t *testing.T) {
	srv := redistest.NewStandalone(t)
	st, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL(), DisableDenyCache: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	e := newEnvUpstream(t, Limits{RPM: 100, TPM: 10000}, up, st, nil, "")
	if res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody); res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	e.settle()
	srv.Kill()
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d", res.StatusCode)
	}
	if ae := decodeError(t, res); *ae.Error.Code != "rate_limiter_unavailable" {
		t.Fatalf("%+v", ae)
	}
	if up.Count() != 1 {
		t.Fatalf("upstream saw %d requests while the limiter was down", up.Count())
	}
}
