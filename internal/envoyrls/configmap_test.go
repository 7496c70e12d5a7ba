package envoyrls

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/configmaptest"
)

// TestConfigMapReload: a config_dir that is a mounted Kubernetes ConfigMap
// is reloaded on each update (a ..data symlink swap, the files themselves
// untouched), and keeps being watched after the first swap removed the
// directory the files pointed into.
func TestConfigMapReload(t *testing.T) {
	rules := readFile(t, "testdata/config/replaces.yaml")
	withLimit := func(n string) map[string]string {
		return map[string]string{"replaces.yaml": strings.Replace(rules, "requests_per_unit: 2", "requests_per_unit: "+n, 1)}
	}
	cm := configmaptest.New(t, withLimit("2"))
	reloads := make(chan error, 16)
	e := newEnv(t, memStore, cm.Path, func(o *Options) {
		o.ReloadDelay = 10 * time.Millisecond
		o.OnReload = func(err error) { reloads <- err }
	})
	ready := make(chan struct{})
	e.svc.watching = func() { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	watching := make(chan error, 1)
	go func() { watching <- e.svc.Watch(ctx) }()
	t.Cleanup(func() { cancel(); <-watching })
	<-ready

	e.expect(e.call("replaces", desc("user", "u")), ok, st{ok, 2, 1, 50 * time.Second})
	for i, limit := range []string{"7", "9", "11"} {
		cm.Update(withLimit(limit))
		// Events of one swap may come as several reloads; wait for the one
		// that sees the new limit.
		deadline := time.After(10 * time.Second)
		for {
			select {
			case err := <-reloads:
				if err != nil {
					t.Fatalf("update %d: reload: %v", i+1, err)
				}
			case <-deadline:
				t.Fatalf("update %d (limit %s): not reloaded within 10s", i+1, limit)
			}
			if got := e.call("replaces", desc("user", "cm-"+limit)); got.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() == uint32(mustAtoi(t, limit)) {
				break
			}
		}
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
