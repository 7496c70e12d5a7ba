package gateway

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/yamlconf"
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

// TestLoadBad loads every testdata/*.bad.yml: each must fail with exactly
// the problems listed, all in one run, located at file:line and field.
func TestLoadBad(t *testing.T) {
	want := map[string][]string{
		"unknown_field.bad.yml":      {"2: tiers.free.tokens_per_minute: unknown field; valid: rpm, rpm_burst, tpm, tpm_burst, rpd, concurrency, timezone, lease, models"},
		"no_upstream.bad.yml":        {"1: upstream.base_url: required, the OpenAI-compatible base URL"},
		"bad_hash.bad.yml":           {"3: keys[0].hash: want the 64 lowercase hex digits of the key's SHA-256 (sluice keys hash KEY)"},
		"unknown_tier.bad.yml":       {`3: keys[0].tier: unknown tier "gold"; valid: free`},
		"negative.bad.yml":           {"2: tiers.free.tpm: -5 must not be negative"},
		"burst_without_rate.bad.yml": {`1: upstream.base_url: "ftp://x/v1" must be an http or https URL`, "2: tiers.free.tpm_burst: a burst needs its rate: set tpm too"},
		"many.bad.yml": {
			`4: upstream.api_key_env: "sk-liv..." is not an environment variable name`,
			"5: upstream.timout: unknown field; did you mean timeout? valid: base_url, api, api_key_env, allow_no_key, timeout",
			`7: store.url: unknown store "postgres://db"; valid: memory, redis://`,
			"8: store.timeout: cannot use `soon` as time.Duration",
			"9: default_max_tokens: -1 must not be negative",
			"10: lease_ttl: 500ms must be at least 1s",
			"13: tiers.free.rpmm: unknown field; did you mean rpm? valid: rpm, rpm_burst, tpm, tpm_burst, rpd, concurrency, timezone, lease, models",
			"14: tiers.free.rpm_burst: a burst needs its rate: set rpm too",
			"20: tiers.pro.models.gpt-3.5-turbo.tpm: -3 must not be negative",
			`24: keys[0].tier: unknown tier "gold"; valid: free, pro`,
			"26: keys[1].hash: same key as keys[0] (a)",
			"28: keys[1].clinet: unknown field; did you mean client? valid: name, hash, tier, client",
		},
	}
	files, _ := filepath.Glob("testdata/*.bad.yml")
	if len(files) != len(want) {
		t.Fatalf("%d fixtures, %d expectations", len(files), len(want))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			_, err := Load(f)
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got %v, want ErrInvalidConfig", err)
			}
			var ye *yamlconf.Error
			if !errors.As(err, &ye) {
				t.Fatalf("error %v is not a *yamlconf.Error", err)
			}
			exp := want[filepath.Base(f)]
			for i, p := range ye.Problems {
				got := fmt.Sprintf("%d: %s: %s", p.Line, p.Path, p.Msg)
				if p.File != f {
					t.Errorf("problem %d names %q, want %q", i, p.File, f)
				}
				if i >= len(exp) || !strings.HasPrefix(got, exp[i]) {
					t.Errorf("problem %d:\n got %s\nwant %v", i, got, exp[min(i, len(exp)-1)])
				}
			}
			if len(ye.Problems) < len(exp) {
				t.Errorf("%d problems, want %d:\n%v", len(ye.Problems), len(exp), err)
			}
			for _, bad := range []string{"gateway: gateway:", "sluice: ", "yaml: ", "not found in type", "sk-live-abcdefgh"} {
				if strings.Contains(err.Error(), bad) {
					t.Errorf("error shows %q:\n%v", bad, err)
				}
			}
		})
	}
}
