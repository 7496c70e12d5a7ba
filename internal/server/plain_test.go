package server

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/redistest"
)

// TestRedisPlainWindowsInServe: plain windows are serve's default on
// Redis, for /v1/check as for Envoy: fixed-window checks are counted in
// per-window keys, mid-window by plain INCRBY (once the store has sampled
// Redis's clock), and decide as before. store.plain_windows: false keeps
// the scripts' layout.
func TestRedisPlainWindowsInServe(t *testing.T) {
	for _, setting := range []string{"", ", plain_windows: true", ", plain_windows: false"} {
		srv := redistest.NewStandalone(t)
		cfg := strings.Replace(testConfig, "anon: {limit: 2/min}", "anon: {limit: 2/min}\n  fw: {algorithm: fixed_window, limit: 1000/h}", 1) +
			fmt.Sprintf("store: {url: %q, timeout: 5s%s}\n", srv.URL(), setting)
		s := startService(t, svcOptions{redis: true, config: cfg})
		plain := plainInServe(t, s, srv)
		if want := setting != ", plain_windows: false"; plain != want {
			t.Errorf("store {%s}: plain path %v, want %v", setting, plain, want)
		}
	}
}

// plainInServe checks fixed-window keys until the plain path has counted
// one by INCRBY (true) or 500 keys went by without (false).
func plainInServe(t *testing.T, s *svc, srv *redistest.Server) bool {
	t.Helper()
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	// The store samples Redis's clock in the background: until it has,
	// and within a few ms of the hour, the scripts decide.
	for i := range 500 {
		body := fmt.Sprintf(`{"policy":"fw","key":"%s%d"}`, prefix, i)
		for j := range 2 {
			if a := s.check(t, body); a.status != 200 || a.num("remaining") != int64(999-j) {
				t.Fatalf("key %d, check %d: %d %s", i, j, a.status, a.raw)
			}
		}
		if n, err := srv.CommandCalls(ctx, "incrby"); err != nil {
			t.Fatal(err)
		} else if n > 0 {
			keys, err := srv.Do(ctx, "KEYS", "fw*")
			if err != nil {
				t.Fatal(err)
			}
			if k, _ := keys.([]any); len(k) == 0 {
				t.Fatalf("no per-window keys: %v", keys)
			}
			m := s.do(t, "GET", "/metrics", "").raw
			if n := metricValue(t, m, "sluice_redis_plain_total"); n == 0 {
				t.Fatal("sluice_redis_plain_total is 0 after a plain INCRBY")
			}
			metricValue(t, m, "sluice_redis_groups_total") // exported
			return true
		}
	}
	return false
}

// TestPlainWindowsRestartOnly: turning store.plain_windows on or off
// takes a restart, as the store's other connection settings do.
func TestPlainWindowsRestartOnly(t *testing.T) {
	running := &config.Config{Store: config.StoreSection{URL: "redis://127.0.0.1:6379"}}
	next := &config.Config{Store: running.Store}
	next.Store.PlainWindows = true
	if got := restartOnly(running, next); len(got) != 1 || got[0] != "store" {
		t.Fatalf("restartOnly: %v, want [store]", got)
	}
}
