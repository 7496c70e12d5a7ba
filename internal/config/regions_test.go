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
	want := map[string]string{"api": "us", "spread": ""}
	if len(cfg.Store.GlobalPolicies) != 2 || cfg.Store.GlobalPolicies["api"] != want["api"] || cfg.Store.GlobalPolicies["spread"] != "" {
		t.Fatalf("global policies %v, want %v", cfg.Store.GlobalPolicies, want)
	}
	if len(cfg.Store.Regions) != 2 || cfg.Store.Global.FailurePolicy != "fail_open" {
		t.Fatalf("store %+v", cfg.Store)
	}
}
