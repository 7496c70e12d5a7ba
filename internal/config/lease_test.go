package config

import (
	"strings"
	"testing"
)

// store.lease is the default of every leasable policy; a policy's own
// `lease` wins; sliding_window_log cannot be leased.
func TestLease(t *testing.T) {
	cfg, err := Parse("l.yaml", []byte(`
store: {lease: true}
policies:
  a: {limit: 5/s}
  b: {limit: 5/s, lease: false}
  c: {algorithm: sliding_window_log, limit: 5/s}
  d: {algorithm: fixed_window, limit: 5/s}
`))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"a": true, "b": false, "c": false, "d": true} {
		if got := cfg.Policies[name].Lease; got != want {
			t.Errorf("policy %s: Lease %v, want %v", name, got, want)
		}
	}
	cfg, err = Parse("l.yaml", []byte("policies:\n  a: {limit: 5/s}\n  b: {limit: 5/s, lease: true}\n"))
	if err != nil || cfg.Policies["a"].Lease || !cfg.Policies["b"].Lease {
		t.Fatalf("without store.lease: %v %+v %+v", err, cfg.Policies["a"], cfg.Policies["b"])
	}
	_, err = Parse("l.yaml", []byte("policies:\n  c: {algorithm: sliding_window_log, limit: 5/s, lease: true}\n"))
	if err == nil || !strings.Contains(err.Error(), "policies.c.lease") {
		t.Fatalf("leased sliding_window_log: %v", err)
	}
}
