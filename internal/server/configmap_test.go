package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/configmaptest"
	"github.com/sluice-io/sluice/memstore"
)

// TestConfigMapReload: a config file in a mounted Kubernetes ConfigMap is
// reloaded on each update, which swaps the ..data symlink and leaves the
// file's own symlink alone, and the watch survives the removal of the
// directory the first version lived in.
func TestConfigMapReload(t *testing.T) {
	withFree := func(limit string) map[string]string {
		return map[string]string{"sluice.yaml": strings.Replace(testConfig, "free: {algorithm: token_bucket, limit: 10/min}", "free: {algorithm: token_bucket, limit: "+limit+"}", 1)}
	}
	cm := configmaptest.New(t, withFree("10/min"))
	reloads := make(chan error, 16)
	listening := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, ServiceOptions{
			ConfigPath: cm.Path + "/sluice.yaml",
			Listen:     "127.0.0.1:0",
			Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
			OnReload:   func(_ *config.Config, err error) { reloads <- err },
			OnListen:   func(a net.Addr) { listening <- a },
			OpenStore: func(context.Context, config.StoreSection) (sluice.Store, io.Closer, error) {
				ms, err := memstore.New(memstore.Options{SweepInterval: -1})
				return ms, ms, err
			},
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	var base string
	select {
	case a := <-listening:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	limit := func() int {
		t.Helper()
		resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(`{"tier":"free","key":"cm"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var d struct{ Limit int }
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
			t.Fatal(err)
		}
		return d.Limit
	}
	if got := limit(); got != 10 {
		t.Fatalf("limit before any update = %d, want 10", got)
	}
	for i, want := range []int{20, 30, 40} {
		cm.Update(withFree(map[int]string{20: "20/min", 30: "30/min", 40: "40/min"}[want]))
		deadline := time.After(10 * time.Second)
		for got := 0; got != want; got = limit() {
			select {
			case err := <-reloads:
				if err != nil {
					t.Fatalf("update %d: reload: %v", i+1, err)
				}
			case <-deadline:
				t.Fatalf("update %d: limit still %d, want %d: the ConfigMap update was not seen", i+1, got, want)
			}
		}
	}
}
