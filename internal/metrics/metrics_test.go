package metrics

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// names returns every metric family name the registry exposes, with one
// sample in each vector.
func names(t *testing.T) map[string]bool {
	m := New()
	m.Decisions.WithLabelValues("p", "t", Allowed).Inc()
	m.DecisionSeconds.WithLabelValues("check").Observe(0.001)
	m.Requests.WithLabelValues("check", "200").Inc()
	m.SetStoreStats(func() StoreStats { return StoreStats{Errors: 3, Circuit: CircuitOpen} })
	m.ReloadResult(errors.New("bad"), time.Now())
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range fams {
		out[f.GetName()] = true
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{"sluice_store_errors_total 3", "sluice_store_circuit_state 2", `sluice_config_reloads_total{result="failure"} 1`, `sluice_config_reloads_total{result="success"} 0`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("exposition lacks %q", want)
		}
	}
	return out
}

var metricRE = regexp.MustCompile(`\bsluice_[a-z0-9_]+`)

// checkExprs fails for a sluice_ metric name in text that the registry
// does not expose.
func checkExprs(t *testing.T, file, text string, known map[string]bool) {
	t.Helper()
	found := 0
	for _, n := range metricRE.FindAllString(text, -1) {
		base := n
		for _, suf := range []string{"_bucket", "_count", "_sum"} {
			base = strings.TrimSuffix(base, suf)
		}
		if !known[base] {
			t.Errorf("%s uses %s, which sluice does not export", file, n)
		}
		found++
	}
	if found == 0 {
		t.Errorf("%s references no sluice metric", file)
	}
}

func TestDeployFilesUseExportedMetrics(t *testing.T) {
	known := names(t)
	// The components beside the API (Envoy, RLQS, the gateway) register
	// theirs on the same registry; TestMetricNamesFile (cmd/sluice) keeps
	// this list of them all current.
	all, err := os.ReadFile("../../deploy/test/testdata/metric-names.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range strings.Fields(string(all)) {
		known[n] = true
	}
	raw, err := os.ReadFile("../../deploy/prometheus/sluice-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
				For                 string
			}
		}
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Expr == "" {
				t.Errorf("rule %s%s has no expr", r.Alert, r.Record)
			}
			alerts[r.Alert] = true
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("rule %s: for %q: %v", r.Alert, r.For, err)
				}
			}
		}
	}
	for _, a := range []string{"SluiceHighBlockRate", "SluiceStoreErrors"} {
		if !alerts[a] {
			t.Errorf("alert %s missing", a)
		}
	}
	checkExprs(t, "sluice-alerts.yaml", string(raw), known)

	raw, err = os.ReadFile("../../deploy/grafana/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	if len(dash.Panels) < 8 {
		t.Errorf("dashboard has %d panels", len(dash.Panels))
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
	}
	checkExprs(t, "sluice.json", string(raw), known)
}
