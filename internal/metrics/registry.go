package metrics

import (
	"regexp"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Registry is a Prometheus registry that also remembers the name of every
// metric registered on it, series or not, so that the dashboards' and
// alerts' queries can be checked against the names the process exports
// (deploy/test).
type Registry struct {
	*prometheus.Registry

	mu    sync.Mutex
	names map[string]bool
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry {
	return &Registry{Registry: prometheus.NewRegistry(), names: map[string]bool{}}
}

// Register registers c and records the names it describes.
func (r *Registry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.record(c)
	return nil
}

// MustRegister registers cs, panicking as prometheus.Registry does.
func (r *Registry) MustRegister(cs ...prometheus.Collector) {
	r.Registry.MustRegister(cs...)
	for _, c := range cs {
		r.record(c)
	}
}

// fqName reads a Desc's name from its String form, the only way the
// client library shows it.
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *Registry) record(c prometheus.Collector) {
	ch := make(chan *prometheus.Desc, 16)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	var names []string
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	r.mu.Lock()
	for _, n := range names {
		r.names[n] = true
	}
	r.mu.Unlock()
}

// Names returns the names of the metrics registered, sorted. A histogram
// or summary is named once; its series add _bucket, _sum and _count.
func (r *Registry) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.names))
	for n := range r.names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
