package config

import (
	"strings"
	"testing"
)

// TestStoreURLEnv: store.url_env reads the URL from the environment (a
// Kubernetes Secret), replaces store.url, fails when unset, and never shows
// the password in an error.
func TestStoreURLEnv(t *testing.T) {
	const doc = "store:\n  url: memory\n  url_env: TEST_SLUICE_REDIS_URL\n"
	t.Setenv("TEST_SLUICE_REDIS_URL", "redis://:s3cret@redis:6379/0")
	cfg, err := Parse("env.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Store.URL != "redis://:s3cret@redis:6379/0" {
		t.Errorf("store URL = %q, want the environment's", cfg.Store.URL)
	}

	t.Setenv("TEST_SLUICE_REDIS_URL", "")
	if _, err := Parse("env.yaml", []byte(doc)); err == nil || !strings.Contains(err.Error(), "TEST_SLUICE_REDIS_URL is not set") {
		t.Errorf("unset variable: err = %v", err)
	}

	t.Setenv("TEST_SLUICE_REDIS_URL", "mysql://u:s3cret@db/x")
	_, err = Parse("env.yaml", []byte(doc))
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad URL from the environment: err = %v, want an error without the password", err)
	}
}
