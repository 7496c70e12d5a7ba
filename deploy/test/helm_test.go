package deploytest

import (
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"sigs.k8s.io/yaml"
)

// render renders deploy/helm/sluice with Helm's own engine and the given
// values (YAML, over the chart's values.yaml), as `helm template` would.
func render(t *testing.T, values string) string {
	t.Helper()
	ch, err := loader.LoadDir("../helm/sluice")
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	rv, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{Name: "rl", Namespace: "edge", IsInstall: true}, common.DefaultCapabilities)
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		if strings.HasSuffix(n, ".yaml") {
			b.WriteString("---\n# " + n + "\n" + out[n] + "\n")
		}
	}
	return b.String()
}

// TestHelmChart renders the chart with its defaults and with every section
// on, decodes every object strictly into the Kubernetes API types (the
// ServiceMonitor into the Prometheus Operator's), and checks them together
// (checkWorkload): the rendered sluice.yaml loads with sluice's own loader.
func TestHelmChart(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		monitors     int
		secrets      int
		check        func(t *testing.T, o *objects)
	}{
		{name: "defaults", values: "{}"},
		{name: "everything", monitors: 1, secrets: 1, values: `
store: {redisURL: "rediss://:pw@redis.example:6380/0", failurePolicy: local, localCache: true, plainWindows: true}
replicaCount: 4
envoy:
  enabled: true
  rules:
    a.yaml: "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
    b.yaml: "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: gcra}\n"
gateway:
  enabled: true
  apiKeySecret: {name: openai, key: token}
serviceMonitor: {enabled: true, labels: {release: prom}}
otel: {endpoint: "http://otel-collector:4317", env: {OTEL_TRACES_SAMPLER: parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG: "0.1"}}
keys:
  - {name: demo, hash: ba8510809b719211000410413fad8dfa3470e9b500c4638729b97a635bec3415, tier: free}
`, check: func(t *testing.T, o *objects) {
			c := o.deployments[0].Spec.Template.Spec.Containers[0]
			env := map[string]bool{}
			for _, e := range c.Env {
				env[e.Name] = true
			}
			for _, want := range []string{"SLUICE_REDIS_URL", "OPENAI_API_KEY", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER"} {
				if !env[want] {
					t.Errorf("no env %s", want)
				}
			}
			if !hasPortName(c, "grpc-rls") || !hasPortName(c, "gateway") {
				t.Errorf("ports %+v lack grpc-rls or gateway", c.Ports)
			}
			if cm := o.configMaps["rl-sluice"]; strings.Contains(cm.Data["sluice.yaml"], "pw@") {
				t.Error("the Redis password is in the ConfigMap")
			}
			if cm := o.configMaps["rl-sluice"]; !strings.Contains(cm.Data["sluice.yaml"], "plain_windows: true") {
				t.Errorf("store.plainWindows did not reach sluice.yaml:\n%s", cm.Data["sluice.yaml"])
			}
		}},
		{name: "existing secret", values: `store: {existingSecret: my-redis, existingSecretKey: uri, plainWindows: false}
podDisruptionBudget: {enabled: false}`, check: func(t *testing.T, o *objects) {
			// false must reach sluice.yaml: sluice's default is true.
			if cm := o.configMaps["rl-sluice"]; !strings.Contains(cm.Data["sluice.yaml"], "plain_windows: false") {
				t.Errorf("store.plainWindows: false did not reach sluice.yaml:\n%s", cm.Data["sluice.yaml"])
			}
			if len(o.pdbs) != 0 {
				t.Error("PodDisruptionBudget rendered though disabled")
			}
			ref := o.deployments[0].Spec.Template.Spec.Containers[0].Env[0].ValueFrom.SecretKeyRef
			if ref.Name != "my-redis" || ref.Key != "uri" {
				t.Errorf("Redis URL from %s/%s, want my-redis/uri", ref.Name, ref.Key)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := render(t, tc.values)
			var o objects
			if err := decodeAll(tc.name, []byte(out), &o); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if len(o.monitors) != tc.monitors || len(o.secrets) != tc.secrets {
				t.Errorf("%d ServiceMonitors and %d Secrets, want %d and %d", len(o.monitors), len(o.secrets), tc.monitors, tc.secrets)
			}
			checkWorkload(t, tc.name, &o)
			if tc.check != nil {
				tc.check(t, &o)
			}
		})
	}
}
