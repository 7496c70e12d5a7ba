package gateway

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadGood(t *testing.T) {
	c, err := Load("testdata/good.yml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != DefaultListen || c.DefaultMaxTokens != DefaultMaxTokens || c.Keys[0].Client != c.Keys[0].Hash[:16] || c.Tiers["free"].Models["big"].TPM != 100 {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

func TestLoadBad(t *testing.T) {
	want := map[string]string{
		"unknown_field.bad.yml":      "field tokens_per_minute not found",
		"no_upstream.bad.yml":        "upstream.base_url is required",
		"bad_hash.bad.yml":           "keys[0] (raw): hash must be 64 lowercase hex digits",
		"unknown_tier.bad.yml":       `unknown tier "gold"; valid: free`,
		"negative.bad.yml":           "tiers.free: tpm -5 must not be negative",
		"burst_without_rate.bad.yml": "a burst needs its rate",
	}
	files, _ := filepath.Glob("testdata/*.bad.yml")
	if len(files) != len(want) {
		t.Fatalf("%d fixtures, %d expectations", len(files), len(want))
	}
	for _, f := range files {
		_, err := Load(f)
		if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want[filepath.Base(f)]) || !strings.Contains(err.Error(), f) {
			t.Errorf("%s: got %v, want %q", f, err, want[filepath.Base(f)])
		}
	}
}
