package deploytest

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// metricNames reads testdata/metric-names.txt, every metric sluice serve
// registers (written by TestMetricNamesFile in cmd/sluice, which fails when
// the file is stale).
func metricNames(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("testdata/metric-names.txt")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		names[l] = true
	}
	if !names["sluice_decisions_total"] || !names["sluice_gateway_spend_microdollars_total"] || !names["sluice_envoy_rls_hits_total"] {
		t.Fatalf("testdata/metric-names.txt lacks the service's, the gateway's or the Envoy service's metrics")
	}
	return names
}

// builtin are series Prometheus makes itself.
var builtin = map[string]bool{"up": true, "scrape_duration_seconds": true, "scrape_samples_scraped": true, "ALERTS": true}

// grafanaVar matches a Grafana variable: $name, ${name} or ${name:format}.
var grafanaVar = regexp.MustCompile(`\$\{?(\w+)(:\w+)?\}?`)

// promQL turns a Grafana query into PromQL: interval variables become
// durations, other variables a label value.
func promQL(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		switch strings.Trim(v, "${}") {
		case "__rate_interval", "__interval", "__range", "__range_s":
			return "5m"
		}
		return "x"
	})
}

// unknownMetrics parses expr and returns the metric names it selects that
// are neither in known, nor a histogram's series of one (_bucket, _sum,
// _count), nor built in.
func unknownMetrics(expr string, known map[string]bool) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var unknown []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					name = m.Value
				}
			}
		}
		if !knownMetric(name, known) {
			unknown = append(unknown, name)
		}
		return nil
	})
	return unknown, nil
}

func knownMetric(name string, known map[string]bool) bool {
	if known[name] || builtin[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && known[base] {
			return true
		}
	}
	return false
}

// labelValues matches a Grafana variable query label_values(metric, label).
var labelValues = regexp.MustCompile(`^label_values\(\s*([^,]+?)\s*,\s*\w+\s*\)$`)

// dashboardQueries returns every query of a dashboard: each "expr" (panel
// targets, annotations) and each variable's "query" that is PromQL.
func dashboardQueries(t *testing.T, v any, path string, out map[string]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			p := path + "." + k
			if s, ok := c.(string); ok {
				switch {
				case k == "expr":
					out[p] = s
				case k == "query" && strings.HasPrefix(s, "label_values("):
					m := labelValues.FindStringSubmatch(s)
					if m == nil {
						t.Errorf("%s: variable query %q is not label_values(metric, label)", p, s)
						continue
					}
					out[p] = m[1]
				}
				continue
			}
			dashboardQueries(t, c, p, out)
		}
	case []any:
		for i, c := range x {
			dashboardQueries(t, c, path+"["+strconv.Itoa(i)+"]", out)
		}
	}
}

// TestDashboardsAndAlertsUseRealMetrics parses every PromQL query of every
// Grafana dashboard in deploy/grafana and every rule of deploy/prometheus
// (with Prometheus's own parser and rule-file loader) and checks that
// every metric a query selects is one sluice registers (or a recording
// rule's). A misspelled metric name fails it.
func TestDashboardsAndAlertsUseRealMetrics(t *testing.T) {
	known := metricNames(t)

	// The toggle: the check itself reports a misspelled name.
	if u, err := unknownMetrics(`sum(rate(sluice_decisons_total[5m])) / sum(rate(sluice_decisions_total[5m]))`, known); err != nil || !slices.Equal(u, []string{"sluice_decisons_total"}) {
		t.Fatalf("a misspelled metric is not reported: %v %v", u, err)
	}

	// Alert and recording rules, strictly (unknown fields are errors).
	rules, _ := filepath.Glob("../prometheus/*.yaml")
	if len(rules) == 0 {
		t.Fatal("no rule files in deploy/prometheus")
	}
	type query struct{ where, expr string }
	var queries []query
	alerts := map[string]bool{}
	for _, f := range rules {
		rgs, errs := rulefmt.ParseFile(f, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.NewTextHandler(io.Discard, nil)))
		for _, err := range errs {
			t.Errorf("%s: %v", f, err)
		}
		if rgs == nil {
			continue
		}
		for _, g := range rgs.Groups {
			for _, r := range g.Rules {
				if r.Record != "" {
					known[r.Record] = true
				}
				if r.Alert != "" {
					alerts[r.Alert] = true
				}
				queries = append(queries, query{f + ": " + r.Record + r.Alert, r.Expr})
			}
		}
	}
	for _, a := range []string{"SluiceGatewayBudgetBurnFast", "SluiceStoreDegraded", "SluiceDenyRatioJump", "SluiceEnvoyOverLimitJump",
		"SluiceUpstreamProvider429", "SluiceUpstreamCoolingDown", "SluiceUpstreamFailovers", "SluiceUpstreamNoHeadroom"} {
		if !alerts[a] {
			t.Errorf("no alert %s", a)
		}
	}

	// Dashboards.
	dashboards, _ := filepath.Glob("../grafana/*.json")
	uids := map[string]string{}
	for _, f := range dashboards {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d map[string]any
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		uid, _ := d["uid"].(string)
		if uid == "" || uids[uid] != "" {
			t.Errorf("%s: uid %q missing or also in %s", f, uid, uids[uid])
		}
		uids[uid] = f
		qs := map[string]string{}
		dashboardQueries(t, d, "", qs)
		if len(qs) < 5 {
			t.Errorf("%s: %d queries", f, len(qs))
		}
		for p, e := range qs {
			queries = append(queries, query{f + p, promQL(e)})
		}
	}
	for _, want := range []string{"sluice-overview", "sluice-envoy-rls", "sluice-gateway"} {
		if uids[want] == "" {
			t.Errorf("no dashboard %s in deploy/grafana", want)
		}
	}

	used := map[string]bool{}
	for _, q := range queries {
		unknown, err := unknownMetrics(q.expr, known)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", q.where, q.expr, err)
			continue
		}
		for _, u := range unknown {
			t.Errorf("%s: metric %s is not registered by sluice (testdata/metric-names.txt)", q.where, u)
		}
		for n := range known {
			if strings.Contains(q.expr, n) {
				used[n] = true
			}
		}
	}
	// The metrics the gateway and Envoy dashboards are for.
	for _, n := range []string{"sluice_gateway_tokens_total", "sluice_gateway_spend_microdollars_total", "sluice_gateway_queue_wait_seconds",
		"sluice_gateway_rejections_total", "sluice_envoy_rls_hits_total", "sluice_envoy_rls_request_duration_seconds", "sluice_store_degraded_total",
		// The upstream pool's health (internal/upstream/metrics.go): its dashboard row and alerts.
		"sluice_gateway_upstream_requests_total", "sluice_gateway_upstream_429_total", "sluice_gateway_upstream_cooldowns_total",
		"sluice_gateway_upstream_failovers_total", "sluice_gateway_upstream_remaining", "sluice_gateway_upstream_tightened_total"} {
		if !used[n] {
			t.Errorf("no dashboard or alert uses %s", n)
		}
	}
}
