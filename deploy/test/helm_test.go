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
	out, err := renderChart(t, values)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return out
}

// renderChart is render that returns the engine's error: a `fail` in a
// template, say.
func renderChart(t *testing.T, values string) (string, error) {
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
		return "", err
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
	return b.String(), nil
}

// TestHelmChart renders the chart with its defaults and with each variant
// docs/deploy.md documents, decodes every object strictly into the
// Kubernetes API types (the ServiceMonitor into the Prometheus Operator's),
// checks them together (checkWorkload: the rendered sluice.yaml loads with
// sluice's own loader) and checks that each is right for a limiter
// (checkRightByDefault: replicas × store, failure policy, memory).
func TestHelmChart(t *testing.T) {
	sz := chartSizing(t)
	for _, tc := range []struct {
		name, values string
		replicas     int32
		redis        bool   // the service's store is Redis
		policy       string // store.failure_policy
		monitors     int
		secrets      int // besides the config's
		pdbs         int
		check        func(t *testing.T, o *objects)
	}{
		{name: "defaults", values: "{}", replicas: 1, policy: "local", check: func(t *testing.T, o *objects) {
			c := o.deployments[0].Spec.Template.Spec.Containers[0]
			if got := c.Resources.Limits.Memory().String(); got != "256Mi" {
				t.Errorf("default memory limit %s, want 256Mi (64 MiB + 3 × 64 MiB of heap)", got)
			}
		}},
		{name: "redis", replicas: 3, redis: true, policy: "local", secrets: 1, pdbs: 1,
			values: `{replicaCount: 3, store: {redisURL: "redis://redis.data:6379/0"}}`},
		{name: "smaller heap", replicas: 1, policy: "local", values: `store: {maxKeys: 100000, maxBytesMiB: 16}`, check: func(t *testing.T, o *objects) {
			if got := o.deployments[0].Spec.Template.Spec.Containers[0].Resources.Limits.Memory().String(); got != "112Mi" {
				t.Errorf("memory limit %s at 16 MiB of heap, want 112Mi", got)
			}
		}},
		{name: "gateway", replicas: 1, policy: "local", values: `gateway: {enabled: true, apiKeySecret: {name: openai}}`},
		{name: "gateway without key", replicas: 1, policy: "local",
			values: `gateway: {enabled: true, config: {upstream: {base_url: "http://vllm.ml:8000/v1", allow_no_key: true}}}`},
		{name: "everything", replicas: 4, redis: true, policy: "fail_closed", monitors: 1, secrets: 1, pdbs: 1, values: `
store: {redisURL: "rediss://:pw@redis.example:6380/0", failurePolicy: fail_closed, localCache: true, plainWindows: true}
replicaCount: 4
envoy:
  enabled: true
  rules:
    a.yaml: "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
    b.yaml: "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: gcra}\n"
gateway:
  enabled: true
  apiKeySecret: {name: openai, key: token}
  config:
    upstream: {base_url: https://api.openai.com/v1, api_key_env: OPENAI_API_KEY}
    tiers: {free: {rpm: 20}}
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
			for _, want := range []string{"SLUICE_REDIS_URL", "OPENAI_API_KEY", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER", "SLUICE_K8S_SERVICE", "SLUICE_K8S_NAMESPACE"} {
				if !env[want] {
					t.Errorf("no env %s", want)
				}
			}
			if !hasPortName(c, "grpc-rls") || !hasPortName(c, "gateway") {
				t.Errorf("ports %+v lack grpc-rls or gateway", c.Ports)
			}
			if cfg := o.secrets["rl-sluice-config"].StringData["sluice.yaml"]; strings.Contains(cfg, "pw@") {
				t.Error("the Redis password is in sluice.yaml, not in its own Secret")
			}
			if cfg := o.secrets["rl-sluice-config"].StringData["sluice.yaml"]; !strings.Contains(cfg, "plain_windows: true") {
				t.Errorf("store.plainWindows did not reach sluice.yaml:\n%s", cfg)
			}
			if u := o.pdbs[0].Spec.MaxUnavailable; u == nil || u.IntValue() != 1 {
				t.Errorf("PodDisruptionBudget maxUnavailable %v, want 1", u)
			}
		}},
		{name: "existing secret", replicas: 2, redis: true, policy: "local", values: `replicaCount: 2
store: {existingSecret: my-redis, existingSecretKey: uri, plainWindows: false}
podDisruptionBudget: {enabled: false}`, check: func(t *testing.T, o *objects) {
			// false must reach sluice.yaml: sluice's default is true.
			if cfg := o.secrets["rl-sluice-config"].StringData["sluice.yaml"]; !strings.Contains(cfg, "plain_windows: false") {
				t.Errorf("store.plainWindows: false did not reach sluice.yaml:\n%s", cfg)
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
			if len(o.monitors) != tc.monitors || len(o.secrets) != tc.secrets+1 || len(o.pdbs) != tc.pdbs {
				t.Errorf("%d ServiceMonitors, %d Secrets and %d PodDisruptionBudgets, want %d, %d (with the config's) and %d",
					len(o.monitors), len(o.secrets), len(o.pdbs), tc.monitors, tc.secrets+1, tc.pdbs)
			}
			cfg := checkWorkload(t, tc.name, &o)
			checkConfigMapsHoldRulesOnly(t, tc.name, &o)
			if got := *o.deployments[0].Spec.Replicas; got != tc.replicas {
				t.Errorf("%d replicas, want %d", got, tc.replicas)
			}
			if cfg.Store.IsMemory() == tc.redis {
				t.Errorf("store %q, want Redis: %v", cfg.Store.URL, tc.redis)
			}
			checkRightByDefault(t, tc.name, &o, cfg, tc.policy, sz)
			if tc.check != nil {
				tc.check(t, &o)
			}
		})
	}
}

// TestHelmChartRefuses renders what could not start or would not hold its
// limits, and expects `fail` to stop the render with a message that says
// what to set.
func TestHelmChartRefuses(t *testing.T) {
	for _, tc := range []struct{ name, values, want string }{
		{"replicas on memory", `replicaCount: 3`,
			"replicaCount is 3 but no store.redisURL or store.existingSecret is set: on the memory store each replica keeps its own counts, so every limit would be 3 times what you wrote"},
		{"gateway without key", `gateway: {enabled: true}`,
			"gateway.enabled needs the upstream key sluice reads from $OPENAI_API_KEY and would not start without"},
		{"gateway store", `{replicaCount: 2, store: {redisURL: "redis://r:6379/0"}, gateway: {enabled: true, apiKeySecret: {name: openai}, config: {store: {url: "redis://:pw@r:6379/1"}}}}`,
			"gateway.config.store is set, but inside sluice serve the gateway keeps its limits in the service's store"},
		{"upstream and upstreams", `gateway: {enabled: true, keys: [{env: K, secret: s}], config: {upstream: {base_url: "http://a/v1", api_key_env: K}, upstreams: [{name: a, kind: openai, base_url: "http://a/v1", key_env: K, models: {m: {rpm: 1}}}], routes: {m: [{upstream: a}]}}}`,
			"gateway.config has both upstream and upstreams"},
		{"upstreams without routes", `gateway: {enabled: true, keys: [{env: K, secret: s}], config: {upstreams: [{name: a, kind: openai, base_url: "http://a/v1", key_env: K, models: {m: {rpm: 1}}}]}}`,
			"gateway.config.upstreams needs routes"},
		{"pool key not set", `gateway: {enabled: true, keys: [{env: K1, secret: s}], config: {upstreams: [{name: a, kind: openai, base_url: "http://a/v1", key_env: K1, models: {m: {rpm: 1}}}, {name: b, kind: azure-openai, base_url: "https://b.openai.azure.com", key_env: K2, models: {m: {rpm: 1}}}], routes: {m: [{upstream: a}, {upstream: b}]}}}`,
			"gateway.enabled needs the upstream key sluice reads from $K2"},
		{"key nobody reads", `gateway: {enabled: true, apiKeySecret: {name: openai}, keys: [{env: OPENAI_APIKEY, secret: s}]}`,
			"gateway.keys sets $OPENAI_APIKEY, which no upstream of gateway.config reads"},
		{"key set twice", `gateway: {enabled: true, apiKeySecret: {name: openai}, keys: [{env: OPENAI_API_KEY, secret: s}]}`,
			"gateway.keys: $OPENAI_API_KEY is set twice"},
		{"key without a variable", `gateway: {enabled: true, apiKeySecret: {name: openai}, keys: [{secret: s, key: k}]}`,
			"gateway.keys: \"\" is not an environment variable name"},
		{"key file", `gateway: {enabled: true, config: {upstreams: [{name: a, kind: openai, base_url: "http://a/v1", key_file: /k, models: {m: {rpm: 1}}}], routes: {m: [{upstream: a}]}}}`,
			"key_file is not mounted by the chart"},
		{"admin token, not its hash", `admin: {tokens: [{name: alice, hash: "0123456789abcdef"}]}`,
			"admin.tokens[0] (alice): hash must be the 64 hex digits of the token's SHA-256"},
		{"memory set by hand", `resources: {limits: {memory: 256Mi}}`,
			"resources.limits.memory and resources.requests.memory are computed from store.maxBytesMiB"},
		{"no heap bound", `store: {maxBytesMiB: 0}`, "store.maxBytesMiB must be at least 1"},
		{"no key bound", `store: {maxKeys: 0}`, "store.maxKeys must be at least 1"},
		{"no replicas", `replicaCount: 0`, "replicaCount is 0: it must be between 1 and 64"},
		{"too many replicas", `{replicaCount: 65, store: {redisURL: "redis://r:6379/0"}}`, "replicaCount is 65: it must be between 1 and 64"},
		{"regions without region", `store: {redisURL: "redis://r:6379/0", regions: {us: {existingSecret: s}}}`, "store.regions is set without store.region"},
		{"region on memory", `store: {region: eu}`, "store.region is set but no store.redisURL or store.existingSecret"},
		{"region URL inline", `store: {redisURL: "redis://r:6379/0", region: eu, regions: {us: {url: "redis://:pw@us:6379/0"}}}`, "store.regions.us needs existingSecret"},
		{"own region listed", `store: {redisURL: "redis://r:6379/0", region: eu, regions: {eu: {existingSecret: s}}}`, "store.regions.eu is this release's own region"},
		{"bad region name", `store: {redisURL: "redis://r:6379/0", region: "eu west"}`, "store.region \"eu west\": a region name is"},
		{"two regions, one variable", `store: {redisURL: "redis://r:6379/0", region: eu, regions: {us-1: {existingSecret: a}, us_1: {existingSecret: b}}}`, "both read SLUICE_REGION_US_1_URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := renderChart(t, tc.values)
			if err == nil {
				t.Fatalf("rendered without error:\n%s", out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to say %q", err, tc.want)
			}
		})
	}
}
