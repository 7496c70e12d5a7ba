package metrics

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRegistryNames: the registry names every metric registered, vectors
// without a series and histograms included, and nothing that failed to
// register.
func TestRegistryNames(t *testing.T) {
	r := NewRegistry()
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "a_total", Help: "h"}, []string{"l"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "b_seconds", Help: "h"})
	if err := r.Register(vec); err != nil {
		t.Fatal(err)
	}
	r.MustRegister(h)
	if err := r.Register(prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "other"})); err == nil {
		t.Fatal("a second a_total was registered")
	}
	if got := r.Names(); !slices.Equal(got, []string{"a_total", "b_seconds"}) {
		t.Errorf("names %v", got)
	}
	if names := New().Registry.Names(); !slices.Contains(names, "sluice_decisions_total") || !slices.Contains(names, "sluice_store_errors_total") || !slices.Contains(names, "go_goroutines") {
		t.Errorf("the service's registry names %v", names)
	}
}
