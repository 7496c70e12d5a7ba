package envoyrls

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

func testMetrics(t *testing.T) *metrics {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry(), 0)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func loadTestdata(t *testing.T, names ...string) (*ruleSet, error) {
	t.Helper()
	var files []configFile
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join("testdata", n))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, configFile{name: n, data: data})
	}
	return parseConfig(files, false, testMetrics(t), nil)
}

// TestBadConfigs loads each testdata/*.bad.yaml and expects
// envoyproxy/ratelimit's message for it, located as "file:line: field: "
// (and, where there are any, the valid values); then several at once,
// which must report every problem in a single error, file by file.
func TestBadConfigs(t *testing.T) {
	const keys = "; valid: algorithm, burst, descriptors, detailed_metric, domain, home, key, lease, metadata, name, quota_mode, rate_limit, replaces, requests_per_unit, scope, shadow_mode, share_threshold, unit, unlimited, value, value_to_metric"
	want := map[string]string{
		"misspelled_key.bad.yaml":              "4: descriptors[0].ratelimit: config error, unknown key 'ratelimit'" + keys,
		"misspelled_key2.bad.yaml":             "6: descriptors[0].rate_limit.requestsperunit: config error, unknown key 'requestsperunit'" + keys,
		"non_string_key.bad.yaml":              "4: descriptors[0].1: config error, key is not of type string: 1",
		"non_map_list.bad.yaml":                "3: descriptors[0]: config error, yaml file contains list of type other than map: a",
		"duplicate_key.bad.yaml":               "8: descriptors[1]: duplicate descriptor composite key 'test-domain.key1_value1'",
		"duplicate_nested_key.bad.yaml":        "9: descriptors[0].descriptors[1]: duplicate descriptor composite key 'test-domain.key1.sub'",
		"duplicate_yaml_key.bad.yaml":          `4: descriptors[0].key: mapping key "key" already defined at line 3`,
		"bad_limit_unit.bad.yaml":              "5: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'; valid: second, minute, hour, day, week, month, year",
		"empty_domain.bad.yaml":                "1: domain: config file cannot have empty domain",
		"empty_key.bad.yaml":                   "3: descriptors[0].key: descriptor has empty key",
		"unlimited_with_unit.bad.yaml":         "6: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited",
		"replaces_self.bad.yaml":               "9: descriptors[0].rate_limit.replaces[0].name: replaces should not contain name of same descriptor",
		"replaces_empty.bad.yaml":              "9: descriptors[0].rate_limit.replaces[0].name: should not have an empty replaces entry",
		"share_threshold_no_wildcard.bad.yaml": "5: descriptors[0].share_threshold: share_threshold can only be used with wildcard values (containing '*'), but found key 'key1_exact'",
		"bad_algorithm.bad.yaml":               `7: descriptors[0].rate_limit.algorithm: sluice: unknown algorithm "leaky_sieve"; valid: gcra, token_bucket, sliding_window_log, sliding_window_counter, fixed_window, concurrency`,
		"float_value.bad.yaml":                 "6: descriptors[0].rate_limit.requests_per_unit: error checking config",
		"negative_rate.bad.yaml":               "6: descriptors[0].rate_limit.requests_per_unit: cannot use a YAML int `-1` as uint32",
		"not_yaml.bad.yaml":                    "2: did not find expected node content",
		"metadata_bad.bad.yaml":                "5: descriptors[0].metadata: error parsing metadata: proto: invalid type: map[interface {}]interface {}",
		"log_rate.bad.yaml":                    "6: descriptors[0].rate_limit.requests_per_unit: sliding_window_log keeps every admission of its window, at most 10000 (here 1000000, each decision reading and rewriting them all); use sliding_window_counter for a higher rate",
	}
	paths, err := filepath.Glob("testdata/*.bad.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var names, all []string
	seen := 0
	for _, path := range paths {
		name := filepath.Base(path)
		if name == "duplicate_domain.bad.yaml" {
			continue
		}
		seen++
		t.Run(name, func(t *testing.T) {
			msg, ok := want[name]
			if !ok {
				t.Fatalf("no expected message for %s", name)
			}
			_, err := loadTestdata(t, name)
			if err == nil {
				t.Fatalf("loaded; want error %q", msg)
			}
			if !errors.Is(err, ErrConfig) {
				t.Errorf("error %v does not wrap ErrConfig", err)
			}
			if got, want := problems(t, err), name+":"+msg; got != want {
				t.Errorf("error\n  %s\nwant\n  %s", got, want)
			}
		})
	}
	if seen != len(want) {
		t.Errorf("%d bad fixtures, %d expected messages", seen, len(want))
	}
	// Files that fail before their domain is compared, after one that
	// fails in a descriptor: every problem, in one error, file by file.
	names = []string{"bad_limit_unit.bad.yaml", "misspelled_key.bad.yaml", "not_yaml.bad.yaml", "negative_rate.bad.yaml"}
	all = nil
	for _, n := range names {
		all = append(all, n+":"+want[n])
	}
	_, err = loadTestdata(t, names...)
	if got, want := problems(t, err), strings.Join(all, "\n"); got != want {
		t.Errorf("fixtures at once:\n%s\nwant\n%s", got, want)
	}
}

// problems returns err's problems one per line; err must be a
// *yamlconf.Error wrapping ErrConfig.
func problems(t *testing.T, err error) string {
	t.Helper()
	var ye *yamlconf.Error
	if !errors.As(err, &ye) || !errors.Is(err, ErrConfig) {
		t.Fatalf("error %v (%T), want a *yamlconf.Error wrapping ErrConfig", err, err)
	}
	lines := make([]string, len(ye.Problems))
	for i, p := range ye.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

func TestDuplicateDomain(t *testing.T) {
	_, err := loadTestdata(t, "config/basic.yaml", "duplicate_domain.bad.yaml")
	want := "duplicate_domain.bad.yaml:2: domain: duplicate domain 'test-domain' in config file"
	if got := problems(t, err); got != want {
		t.Fatalf("error %s, want %s", got, want)
	}
	data, _ := os.ReadFile("testdata/config/basic.yaml")
	extra, _ := os.ReadFile("testdata/duplicate_domain.bad.yaml")
	cfg, err := parseConfig([]configFile{{"a.yaml", data}, {"b.yaml", extra}}, true, testMetrics(t), nil)
	if err != nil {
		t.Fatalf("merge: %v", err)
	}
	if r := lookupRule(cfg, "test-domain", "other", ""); r == nil || r.limit.Rate != 5 {
		t.Errorf("merged domain lacks the second file's descriptor")
	}
	if r := lookupRule(cfg, "test-domain", "key2", "x"); r == nil || r.limit.Rate != 20 {
		t.Errorf("merged domain lacks the first file's descriptor")
	}
}

func entries(kv ...string) []*ratelimitv3.RateLimitDescriptor_Entry {
	var out []*ratelimitv3.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func lookupRule(cfg *ruleSet, domain string, kv ...string) *rule {
	d := cfg.domains[domain]
	if d == nil {
		return nil
	}
	return d.lookup(entries(kv...)).rule
}

// TestLookup follows envoyproxy/ratelimit's TestBasicConfig: which request
// descriptors find which limit.
func TestLookup(t *testing.T) {
	files, err := readDir("testdata/config")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := parseConfig(files, false, testMetrics(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.domains) != 6 {
		t.Fatalf("%d domains, want 6 (notes.txt is skipped)", len(cfg.domains))
	}
	type want struct {
		rate    int64
		unit    rlsv3.RateLimitResponse_RateLimit_Unit
		fullKey string
	}
	sec, min, hour, day := rlsv3.RateLimitResponse_RateLimit_SECOND, rlsv3.RateLimitResponse_RateLimit_MINUTE, rlsv3.RateLimitResponse_RateLimit_HOUR, rlsv3.RateLimitResponse_RateLimit_DAY
	cases := []struct {
		domain string
		kv     []string
		want   *want
	}{
		{"foo_domain", []string{"key1", "value1"}, nil},
		{"test-domain", nil, nil},
		{"test-domain", []string{"key1", "something"}, nil},
		{"test-domain", []string{"key1", "value1"}, nil},
		{"test-domain", []string{"key2", "value2", "subkey", "subvalue"}, nil},
		{"test-domain", []string{"key5", "value5", "subkey5", "subvalue"}, nil},
		{"test-domain", []string{"key1", "value1", "subkey1", "something"}, &want{5, sec, "test-domain.key1_value1.subkey1"}},
		{"test-domain", []string{"key1", "value1", "subkey1", "subvalue1"}, &want{10, sec, "test-domain.key1_value1.subkey1_subvalue1"}},
		{"test-domain", []string{"key2", "something"}, &want{20, min, "test-domain.key2"}},
		{"test-domain", []string{"key2", "value2"}, &want{30, min, "test-domain.key2_value2"}},
		{"test-domain", []string{"key3", "foo"}, &want{1, hour, "test-domain.key3"}},
		{"test-domain", []string{"key4", "foo"}, &want{1, day, "test-domain.key4"}},
		{"wildcard", []string{"path", "/foo/bar"}, &want{20, min, "wildcard.path_/foo/bar"}},
		{"wildcard", []string{"path", "/foo/baz"}, &want{10, min, "wildcard.path_/foo/*"}},
		{"wildcard", []string{"path", "/bar/x"}, &want{3, min, "wildcard.path_/bar/*"}},
		{"wildcard", []string{"path", "/api/x/v1"}, &want{4, min, "wildcard.path_/api*v1"}},
		{"wildcard", []string{"path", "/api/x/v2"}, &want{100, min, "wildcard.path"}},
		{"wildcard", []string{"path", "/other"}, &want{100, min, "wildcard.path"}},
	}
	for _, c := range cases {
		r := lookupRule(cfg, c.domain, c.kv...)
		if c.want == nil {
			if r != nil {
				t.Errorf("%s %v: found %s, want none", c.domain, c.kv, r.fullKey)
			}
			continue
		}
		if r == nil {
			t.Errorf("%s %v: no limit, want %d/%s", c.domain, c.kv, c.want.rate, c.want.unit)
			continue
		}
		if r.limit.Rate != c.want.rate || r.unit != c.want.unit || r.fullKey != c.want.fullKey || r.algorithm != sluice.FixedWindow {
			t.Errorf("%s %v: %d/%s %s %s, want %d/%s %s fixed_window", c.domain, c.kv, r.limit.Rate, r.unit, r.fullKey, r.algorithm, c.want.rate, c.want.unit, c.want.fullKey)
		}
	}
	if r := lookupRule(cfg, "test-domain", "key6", "x"); r == nil || !r.unlimited {
		t.Errorf("key6 is not unlimited")
	}
	if r := lookupRule(cfg, "algos", "tb", ""); r == nil || r.algorithm != sluice.TokenBucket || r.limit.Burst != 20 {
		t.Errorf("tb: %+v", r)
	}
	if r := lookupRule(cfg, "algos", "sw", ""); r == nil || r.algorithm != sluice.SlidingWindowCounter {
		t.Errorf("sw: %+v", r)
	}
	m := cfg.domains["wildcard"].lookup(entries("path", "/bar/x"))
	if len(m.shared) != 1 || m.shared[0] != "/bar/*" {
		t.Errorf("share_threshold: shared %q, want [/bar/*]", m.shared)
	}
}

func TestGlobMatch(t *testing.T) {
	for _, c := range []struct {
		p, s string
		want bool
	}{
		{"a*", "a", true}, {"a*", "abc", true}, {"a*", "ba", false},
		{"a*c", "abc", true}, {"a*c", "ac", true}, {"a*c", "acb", false},
		{"s*e*c", "sxexc", true}, {"s*e*c", "sxc", false}, {"*", "", true},
		{"abc", "abc", true}, {"abc", "abcd", false}, {"a*bc*bc", "abcbc", true},
	} {
		if got := globMatch(c.p, c.s); got != c.want {
			t.Errorf("globMatch(%q, %q) = %v", c.p, c.s, got)
		}
	}
}
