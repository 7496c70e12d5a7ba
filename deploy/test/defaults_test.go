package deploytest

import (
	"os"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/internal/config"
)

// sizing is the chart's memory model, values.yaml's memory: section: the
// one place the bytes a key costs and the process's base are written. The
// Kubernetes manifests are checked against it too.
type sizing struct {
	RSSPerHeapMiB int64 `json:"rssPerHeapMiB"`
	BaseMiB       int64 `json:"baseMiB"`
}

func chartSizing(t *testing.T) sizing {
	t.Helper()
	data, err := os.ReadFile("../helm/sluice/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Memory sizing `json:"memory"`
	}
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	if v.Memory.RSSPerHeapMiB <= 0 || v.Memory.BaseMiB <= 0 {
		t.Fatalf("values.yaml memory: %+v", v.Memory)
	}
	return v.Memory
}

// measuredRSS is what the memory store was measured to take resident at
// its peak under a 10 M-key flood: 27 MiB + 2.7 × max_bytes (make flood;
// docs/BENCHMARKS.md, "Sizing"). A memory limit below it gets the pod
// OOM-killed once a caller fills the bound.
func measuredRSS(heap int64) int64 { return 27<<20 + heap*27/10 }

const mib = 1 << 20

// checkRightByDefault asserts what every deploy file must get right for a
// limiter, whatever the variant: several replicas never count on separate
// memory stores (the gateway's limits are in the service's store), the failure policy is
// the one wanted, and the memory request and limit are sized from the key
// bounds the config sets, by the chart's model and above the measured RSS.
func checkRightByDefault(t *testing.T, name string, o *objects, cfg *config.Config, wantPolicy string, sz sizing) {
	t.Helper()
	replicas := *o.deployments[0].Spec.Replicas
	if replicas > 1 && cfg.Store.IsMemory() {
		t.Errorf("%s: %d replicas on the memory store: every limit counts %d times", name, replicas, replicas)
	}
	if cfg.Store.FailurePolicy != wantPolicy {
		t.Errorf("%s: store.failure_policy %q, want %q", name, cfg.Store.FailurePolicy, wantPolicy)
	}
	if cfg.Store.MaxKeys <= 0 || cfg.Store.MaxBytes <= 0 {
		t.Errorf("%s: store.max_keys %d, max_bytes %d: the memory limit must be sized from explicit bounds", name, cfg.Store.MaxKeys, cfg.Store.MaxBytes)
	}
	// Inside sluice serve the gateway keeps its limits in the service's
	// store (cmd/sluice/gateway.go): its heap is within max_bytes.
	heap := cfg.Store.MaxBytes
	want := (sz.BaseMiB*mib + heap*sz.RSSPerHeapMiB + mib - 1) / mib * mib
	res := o.deployments[0].Spec.Template.Spec.Containers[0].Resources
	lim, req := res.Limits.Memory(), res.Requests.Memory()
	if lim.Value() != want || req.Value() != want {
		t.Errorf("%s: memory request %s and limit %s, want %dMi each (%d MiB + %d × %d MiB of heap)", name, req, lim, want/mib, sz.BaseMiB, sz.RSSPerHeapMiB, heap/mib)
	}
	if lim.Value() < measuredRSS(heap) {
		t.Errorf("%s: memory limit %s is below the %d MiB measured at %d MiB of heap", name, lim, measuredRSS(heap)/mib, heap/mib)
	}
}
