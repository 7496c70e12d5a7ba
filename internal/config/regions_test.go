package config

import (
	"testing"
)

// A region with two others, a global policy homed in one of them, one
// homed by hash, and a regional one.
func TestRegionsConfig(t *testing.T) {
	cfg, err := Parse("regions.yaml", []byte(`
store:
  url: redis://eu-redis:6379
  region: eu
  regions:
    us: {url: "redis://us-redis:6379"}
    ap: {url: "redis+sentinel://ap-s1:26379/main"}
  global: {failure_policy: fail_open, clock_skew: 20ms}
policies:
  api: {limit: 1000/s, scope: global, home: us}
  spread: {limit: 100/min, algorithm: fixed_window, scope: global}
  loose: {limit: 100/s, scope: global, mode: async}
  local: {limit: 10/s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Policies["api"]; !p.Global || p.Home != "us" {
		t.Fatalf("api: global %v home %q", p.Global, p.Home)
	}
	if p := cfg.Policies["local"]; p.Global {
		t.Fatal("local is global")
	}
	if p := cfg.Policies["loose"]; !p.Global || !p.Async || cfg.Policies["api"].Async {
		t.Fatalf("loose: global %v async %v; api async %v", p.Global, p.Async, cfg.Policies["api"].Async)
	}
	if len(cfg.Store.AsyncPolicies) != 1 || !cfg.Store.AsyncPolicies["loose"] {
		t.Fatalf("async policies %v, want loose", cfg.Store.AsyncPolicies)
	}
	want := map[string]string{"api": "us", "spread": "", "loose": ""}
	if len(cfg.Store.GlobalPolicies) != 3 || cfg.Store.GlobalPolicies["api"] != want["api"] || cfg.Store.GlobalPolicies["spread"] != "" {
		t.Fatalf("global policies %v, want %v", cfg.Store.GlobalPolicies, want)
	}
	if len(cfg.Store.Regions) != 2 || cfg.Store.Global.FailurePolicy != "fail_open" {
		t.Fatalf("store %+v", cfg.Store)
	}
}
