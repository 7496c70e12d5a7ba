package deploytest

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// freeFormValues are the values.yaml keys whose content is the user's own
// (a sluice config section, labels, Kubernetes fields): unknownValues does
// not look inside them.
var freeFormValues = map[string]bool{
	"policies": true, "tiers": true, "keys": true, "overrides": true, "authz": true,
	"admin.tokens": true, "allowedHosts": true, "envoy.rules": true,
	"gateway.config": true, "gateway.keys": true, "otel.env": true,
	"resources": true, "serviceMonitor.labels": true, "podAnnotations": true, "podLabels": true,
	"nodeSelector": true, "tolerations": true, "affinity": true, "imagePullSecrets": true,
	"store.regions": true, "store.global": true,
}

// unknownValues lists the keys of v, at path, that the chart's values.yaml
// does not have: Helm ignores them silently, so a misspelt value in a
// documented example would do nothing.
func unknownValues(v, defaults map[string]any, path string) []string {
	var out []string
	for k, val := range v {
		p := k
		if path != "" {
			p = path + "." + k
		}
		def, ok := defaults[k]
		if !ok {
			out = append(out, p)
			continue
		}
		sub, isMap := val.(map[string]any)
		defSub, defIsMap := def.(map[string]any)
		if isMap && defIsMap && !freeFormValues[p] {
			out = append(out, unknownValues(sub, defSub, p)...)
		}
	}
	sort.Strings(out)
	return out
}

// TestHelmExamples renders every values file under
// deploy/helm/sluice/examples (each documented in docs/deploy.md) with
// Helm's engine, decodes every object strictly into the Kubernetes API
// types, loads the sluice config it mounts with sluice's own loader (and
// the gateway's key check, with every key variable set from a Secret),
// holds it to the limiter's rules (checkRightByDefault) and checks what
// each example is for.
func TestHelmExamples(t *testing.T) {
	paths, err := filepath.Glob("../helm/sluice/examples/*.yaml")
	if err != nil || len(paths) < 5 {
		t.Fatalf("examples: %v %v", paths, err)
	}
	docs, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	rawDefaults, err := os.ReadFile("../helm/sluice/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var defaults map[string]any
	if err := yaml.Unmarshal(rawDefaults, &defaults); err != nil {
		t.Fatal(err)
	}
	// The toggle: a misspelt value is found.
	if u := unknownValues(map[string]any{"console": map[string]any{"enable": true}}, defaults, ""); !slices.Equal(u, []string{"console.enable"}) {
		t.Fatalf("unknownValues missed console.enable: %v", u)
	}
	sz := chartSizing(t)
	checks := map[string]func(t *testing.T, o *objects, cfgText string){
		"console-admin.yaml": func(t *testing.T, o *objects, cfgText string) {
			for _, want := range []string{"console:\n  enabled: true", "name: alice", "- sluice.example.com"} {
				if !strings.Contains(cfgText, want) {
					t.Errorf("sluice.yaml lacks %q:\n%s", want, cfgText)
				}
			}
			if !hasSecretEnv(o.deployments[0].Spec.Template.Spec.Containers[0], "SLUICE_ADMIN_TOKEN") {
				t.Error("SLUICE_ADMIN_TOKEN is not set from a Secret")
			}
		},
		"gateway-pool.yaml": func(t *testing.T, o *objects, cfgText string) {
			secrets := map[string]bool{}
			for _, e := range o.deployments[0].Spec.Template.Spec.Containers[0].Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					secrets[e.ValueFrom.SecretKeyRef.Name] = true
				}
			}
			if !secrets["openai"] || !secrets["providers"] {
				t.Errorf("keys from Secrets %v, want openai and providers", secrets)
			}
			if strings.Contains(cfgText, "\n  upstream:") || !strings.Contains(cfgText, "kind: azure-openai") {
				t.Errorf("the gateway section has a single upstream beside the pool, or no Azure upstream:\n%s", cfgText)
			}
		},
		"regions-eu.yaml": func(t *testing.T, o *objects, cfgText string) {
			// Each other region's URL reaches the pod from its own Secret,
			// and the loaded config names the regions and the global
			// policies (checkWorkload loaded it with sluice's loader).
			refs := map[string]string{}
			for _, e := range o.deployments[0].Spec.Template.Spec.Containers[0].Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					refs[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
				}
			}
			if refs["SLUICE_REGION_US_URL"] != "sluice-redis-us/url" || refs["SLUICE_REGION_AP_URL"] != "sluice-redis-ap/url" {
				t.Errorf("region URLs from Secrets: %v", refs)
			}
			for _, want := range []string{"region: eu", "url_env: SLUICE_REGION_AP_URL", "clock_skew: 20ms", "scope: global"} {
				if !strings.Contains(cfgText, want) {
					t.Errorf("sluice.yaml lacks %q:\n%s", want, cfgText)
				}
			}
			if strings.Contains(cfgText, "redis.us") || strings.Contains(cfgText, "PASSWORD") {
				t.Errorf("a region's URL is in the config Secret, not read from its own:\n%s", cfgText)
			}
		},
		"envoy-redis.yaml": func(t *testing.T, o *objects, cfgText string) {
			if cm := o.configMaps["rl-sluice-ratelimit"]; cm == nil || !strings.Contains(cm.Data["services.yaml"], "quota_mode: true") {
				t.Errorf("the rules ConfigMap lacks services.yaml with quota_mode: %v", cm)
			}
		},
	}
	for _, path := range paths {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			values, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(docs), "examples/"+name) {
				t.Errorf("docs/deploy.md does not document examples/%s", name)
			}
			var v map[string]any
			if err := yaml.Unmarshal(values, &v); err != nil {
				t.Fatal(err)
			}
			if u := unknownValues(v, defaults, ""); len(u) > 0 {
				t.Errorf("values the chart does not have (Helm would ignore them): %v", u)
			}
			out := render(t, string(values))
			var o objects
			if err := decodeAll(name, []byte(out), &o); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			cfg := checkWorkload(t, name, &o)
			checkConfigMapsHoldRulesOnly(t, name, &o)
			checkRightByDefault(t, name, &o, cfg, "local", sz)
			cfgSecret := o.secrets["rl-sluice-config"]
			if cfgSecret == nil {
				t.Fatal("no config Secret rl-sluice-config")
			}
			if check := checks[name]; check != nil {
				check(t, &o, secretData(cfgSecret)["sluice.yaml"])
			}
		})
	}
}
