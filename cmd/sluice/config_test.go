package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/gateway"
)

func TestConfigCheckFilesAndEnvoyDirs(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"config", "check", "../../examples/sluice.yaml", "../../deploy/envoy/sluice.yaml", "../../deploy/envoy/ratelimit"}
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("config check: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{"examples/sluice.yaml: ok", "envoy config_dir", "ratelimit: ok: envoyproxy/ratelimit config, 1 domains"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestConfigCheckRejectsBadEnvoyDir(t *testing.T) {
	dir := t.TempDir()
	bad, err := os.ReadFile("../../internal/envoyrls/testdata/unlimited_with_unit.bad.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rl := filepath.Join(dir, "rl")
	if err := os.Mkdir(rl, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rl, "d.yaml"), bad, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte("envoy:\n  config_dir: rl\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, arg := range []string{cfg, rl} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"config", "check", arg}, &out, &errOut)
		if err == nil || exitCode(err) != 1 {
			t.Fatalf("check %s: err %v, want exit 1", arg, err)
		}
		if !strings.Contains(errOut.String(), "d.yaml:6: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited") {
			t.Errorf("check %s: error does not locate the problem:\n%s", arg, errOut.String())
		}
	}
}

// TestConfigCheckDetectsEachKind checks the shipped examples of every kind
// at once: none may report a problem, and each is named by its kind.
func TestConfigCheckDetectsEachKind(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"config", "check", "../../examples/gateway.yaml", "../../examples/sluice.yaml", "../../deploy/envoy/ratelimit/edge.yaml", "../../deploy/envoy/ratelimit"}
	if err := run(context.Background(), args, &out, &errOut); err != nil || errOut.Len() > 0 {
		t.Fatalf("config check: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{
		"examples/gateway.yaml: ok: sluice gateway config: 2 tiers, 2 keys",
		"examples/sluice.yaml: ok: sluice serve config: 6 policies",
		"edge.yaml: ok: envoyproxy/ratelimit config, 1 domains",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestConfigCheckBadFixtures checks one bad fixture of each kind; each run
// must report every problem of the file, and nothing else.
func TestConfigCheckBadFixtures(t *testing.T) {
	const dir = "testdata/check/"
	cases := map[string][]string{
		"serve.bad.yaml": {
			dir + "serve.bad.yaml: invalid sluice serve config, 4 problems:",
			dir + `serve.bad.yaml:3: store.failure_policy: unknown failure policy "fail_maybe"; valid: local, fail_open, fail_closed, error`,
			dir + "serve.bad.yaml:7: policies.free.brust: unknown field; did you mean burst? valid: algorithm, limit, burst, shadow, lease, max_wait, delay, nginx, scope, home, mode, timezone, reset_at, week_starts",
			dir + `serve.bad.yaml:10: tiers.free.policies[1]: unknown policy "gold"; valid: free`,
			dir + `serve.bad.yaml:12: authz.default_tier: unknown tier "platinum"; valid: free`,
		},
		"gateway.bad.yaml": {
			dir + "gateway.bad.yaml: invalid sluice gateway config, 4 problems:",
			dir + "gateway.bad.yaml:6: tiers.free.rpmm: unknown field; did you mean rpm? valid: rpm, rpm_burst, tpm, tpm_burst, rpd, concurrency, timezone, lease, models, class, weight, budgets, itpm, itpm_burst, otpm, otpm_burst, session, scope, home",
			dir + "gateway.bad.yaml:7: tiers.free.tpm: -1 must not be negative",
			dir + `gateway.bad.yaml:11: keys[0].tier: unknown tier "gold"; valid: free`,
			dir + `gateway.bad.yaml:12: allowed_hosts[1]: "gw.example:8090": want a host name (no port, no scheme), *.domain, an IP address, or *`,
		},
		"envoy.bad.yaml": {
			dir + "envoy.bad.yaml: invalid envoyproxy/ratelimit config, 3 problems:",
			dir + "envoy.bad.yaml:6: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'; valid: second, minute, hour, day, week, month, year",
			dir + "envoy.bad.yaml:8: descriptors[1]: duplicate descriptor composite key 'edge.path_/login'",
			dir + "envoy.bad.yaml:11: descriptors[2].key: descriptor has empty key",
		},
		"envoy_dir.bad": {
			dir + "envoy_dir.bad: invalid envoyproxy/ratelimit config directory, 2 problems:",
			dir + "envoy_dir.bad/a.yaml:4: descriptors[0].ratelimit: config error, unknown key 'ratelimit'; valid: algorithm, burst, descriptors, detailed_metric, domain, home, key, lease, metadata, name, quota_mode, rate_limit, replaces, requests_per_unit, scope, shadow_mode, share_threshold, unit, unlimited, value, value_to_metric",
			dir + "envoy_dir.bad/b.yaml:4: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited",
		},
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(cases) {
		t.Errorf("%d fixtures, %d cases", len(entries), len(cases))
	}
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), []string{"config", "check", dir + name}, &out, &errOut)
			if exitCode(err) != 1 || err == nil {
				t.Fatalf("err %v, want exit 1", err)
			}
			got := strings.Split(strings.TrimSpace(errOut.String()), "\n")
			for i := range got {
				got[i] = strings.TrimSpace(got[i])
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			for _, bad := range []string{"sluice: sluice:", "gateway: gateway:", "envoyrls: bad config", "not found in type"} {
				if strings.Contains(errOut.String()+err.Error(), bad) {
					t.Errorf("output repeats %q", bad)
				}
			}
		})
	}
}

// TestGatewayCommandReportsEveryProblem runs `sluice gateway` on a file with
// a typo: the error is the shared loader's, not yaml.v3's raw text.
func TestGatewayCommandReportsEveryProblem(t *testing.T) {
	err := run(context.Background(), []string{"gateway", "--config", "testdata/check/gateway.bad.yaml"}, io.Discard, io.Discard)
	if err == nil {
		t.Fatal("gateway started on a bad config")
	}
	for _, want := range []string{"gateway.bad.yaml:6: tiers.free.rpmm: unknown field; did you mean rpm?", "gateway.bad.yaml:7: tiers.free.tpm", `gateway.bad.yaml:11: keys[0].tier: unknown tier "gold"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "not found in type") || strings.Count(err.Error(), "gateway: ") > 1 {
		t.Errorf("raw or repeated text:\n%v", err)
	}
}

// TestConfigCheckWarnsFailOpen: fail_open on Redis is valid, but check
// states what it costs; the default policy draws no warning.
func TestConfigCheckWarnsFailOpen(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		store string
		warn  bool
	}{
		{"store: {url: \"redis://127.0.0.1:6379\", failure_policy: fail_open}\n", true},
		{"store: {url: \"redis://127.0.0.1:6379\", failure_policy: local}\n", false},
		{"store: {url: memory, failure_policy: fail_open}\n", false},
	} {
		path := filepath.Join(dir, "sluice.yaml")
		if err := os.WriteFile(path, []byte("policies:\n  p: {limit: 5/s}\n"+c.store), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		if err := run(context.Background(), []string{"config", "check", path}, &out, &errOut); err != nil {
			t.Fatalf("%s: %v\n%s", c.store, err, errOut.String())
		}
		got := strings.Contains(errOut.String(), "warning: store.failure_policy: fail_open admits every request")
		if got != c.warn {
			t.Errorf("%s: warning %v, want %v:\n%s", c.store, got, c.warn, errOut.String())
		}
	}
}

// TestGatewayCommandNamesServeConfig: a serve config given to `sluice
// gateway` is named as such, with the command that runs it.
func TestGatewayCommandNamesServeConfig(t *testing.T) {
	err := run(context.Background(), []string{"gateway", "--config", "../../examples/sluice.yaml"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "looks like a sluice serve config") || !strings.Contains(err.Error(), "sluice serve --config ../../examples/sluice.yaml") {
		t.Fatalf("err %v", err)
	}
}

// TestConfigCheckRedactsUpstream: `sluice config check` (often run in CI,
// whose logs are widely readable) and the gateway's start-up lines name
// the upstream without the password of its URL, as the gateway's own
// errors and logs do; they printed it whole.
func TestConfigCheckRedactsUpstream(t *testing.T) {
	const secret = "pw-s3cret-upstream"
	gw, err := os.ReadFile("../../examples/gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	withSecret := strings.Replace(string(gw), "base_url: https://api.openai.com/v1", "base_url: https://acct:"+secret+"@api.openai.com/v1", 1)
	if withSecret == string(gw) {
		t.Fatal("examples/gateway.yaml has no base_url to replace")
	}
	dir := t.TempDir()
	gwPath, servePath := filepath.Join(dir, "gateway.yaml"), filepath.Join(dir, "sluice.yaml")
	indented := "  " + strings.ReplaceAll(withSecret, "\n", "\n  ")
	for path, body := range map[string]string{gwPath: withSecret, servePath: "policies:\n  p: {limit: 5/s}\ngateway:\n" + indented + "\n"} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"config", "check", gwPath, servePath}, &out, &errOut); err != nil {
		t.Fatalf("config check: %v\n%s", err, errOut.String())
	}
	if all := out.String() + errOut.String(); strings.Contains(all, secret) || strings.Count(all, "https://acct:xxxxx@api.openai.com/v1") != 2 {
		t.Fatalf("config check output:\n%s", all)
	}
	cfg, err := gateway.Parse(gwPath, []byte(strings.Replace(withSecret, "api_key_env: OPENAI_API_KEY", "api_key_env: SLUICE_TEST_NO_SUCH_KEY\n  allow_no_key: true", 1)))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	if err := checkGatewayKey(cfg, func(string) string { return "" }, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), secret) || !strings.Contains(logs.String(), "acct:xxxxx@") {
		t.Fatalf("start-up line: %s", logs.String())
	}
}

// TestConfigCheckDirectoryKinds checks directories by what each file is:
// examples/ (a serve and a gateway config, no rules) without a problem;
// envoyproxy/ratelimit's own examples directory as one rules directory;
// a directory mixing a serve config, rules and an Envoy bootstrap, with
// the rules checked together (a domain twice is an error) and the
// bootstrap skipped.
func TestConfigCheckDirectoryKinds(t *testing.T) {
	check := func(args ...string) (string, string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"config", "check"}, args...), &out, &errOut)
		return out.String(), errOut.String(), err
	}
	out, errs, err := check("../../examples")
	if err != nil || errs != "" {
		t.Fatalf("config check examples/: %v\n%s", err, errs)
	}
	for _, want := range []string{"gateway.yaml: ok: sluice gateway config", "sluice.yaml: ok: sluice serve config"} {
		if !strings.Contains(out, want) {
			t.Errorf("examples/: output lacks %q:\n%s", want, out)
		}
	}
	out, errs, err = check("../../internal/envoyrls/testdata/erl-examples")
	if err != nil || !strings.Contains(out, "erl-examples: ok: envoyproxy/ratelimit config, 2 domains") {
		t.Errorf("envoyproxy/ratelimit's examples: %v\n%s%s", err, out, errs)
	}

	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	serve, err := os.ReadFile("../../examples/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bootstrap, err := os.ReadFile("../../deploy/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	write("sluice.yaml", string(serve))
	write("envoy.yaml", string(bootstrap))
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("notes.txt", "not YAML: ignored")
	out, errs, err = check(dir)
	if err != nil || errs != "" {
		t.Fatalf("mixed directory: %v\n%s%s", err, out, errs)
	}
	for _, want := range []string{"sluice.yaml: ok: sluice serve config", "envoy.yaml: skipped", ": ok: envoyproxy/ratelimit config, 1 files, 1 domains"} {
		if !strings.Contains(out, want) {
			t.Errorf("mixed directory: output lacks %q:\n%s", want, out)
		}
	}
	write("b.yml", "domain: a\ndescriptors: []\n")
	_, errs, err = check(dir)
	if err == nil || !strings.Contains(errs, "b.yml:1: domain: duplicate domain 'a' in config file") {
		t.Errorf("a domain in two files of a mixed directory: err %v\n%s", err, errs)
	}
}

// TestConfigCheckOfflinePool: `config check` is offline: a pool config
// whose provider keys are not in this environment (they are where the
// gateway runs) passes; --env checks them, naming each missing one, and
// passes once they are set.
func TestConfigCheckOfflinePool(t *testing.T) {
	data, err := os.ReadFile("../../internal/gateway/testdata/pool.yml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key := filepath.Join(dir, "pool.key")
	if err := os.WriteFile(key, []byte("azure-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), "testdata/pool.key", key, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	// The same section inside a sluice serve config.
	serve := filepath.Join(dir, "sluice.yaml")
	indented := "  " + strings.ReplaceAll(strings.TrimSpace(strings.Replace(string(data), "testdata/pool.key", key, 1)), "\n", "\n  ")
	if err := os.WriteFile(serve, []byte("policies:\n  p: {limit: 10/s}\ngateway:\n  listen: 127.0.0.1:0\n"+indented+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OPENAI_KEY_EAST", "")
	t.Setenv("ANTHROPIC_KEY_A", "")
	for _, p := range []string{path, serve} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), []string{"config", "check", p}, &out, &errOut); err != nil || errOut.Len() > 0 {
			t.Fatalf("offline check of %s: %v\n%s", p, err, errOut.String())
		}
		errOut.Reset()
		err := run(context.Background(), []string{"config", "check", "--env", p}, &out, &errOut)
		if exitCode(err) != 1 || !strings.Contains(errOut.String(), "upstream openai-east") || !strings.Contains(errOut.String(), "ANTHROPIC_KEY_A is empty") {
			t.Fatalf("--env check of %s: %v\n%s", p, err, errOut.String())
		}
	}
	t.Setenv("OPENAI_KEY_EAST", "sk-east")
	t.Setenv("ANTHROPIC_KEY_A", "sk-ant")
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"config", "check", "--env", path, serve}, &out, &errOut); err != nil {
		t.Fatalf("--env with the keys set: %v\n%s", err, errOut.String())
	}
}

// TestConfigCheckGlobalEnvoyRule: sluice config check reads an Envoy
// rule's scope: global against the serve config's regions: with
// store.region and store.regions it is ok, and its home must be one of
// them; checked alone (no regions) it is an error naming the rule's field.
func TestConfigCheckGlobalEnvoyRule(t *testing.T) {
	dir := t.TempDir()
	rl := filepath.Join(dir, "rl")
	if err := os.Mkdir(rl, 0o755); err != nil {
		t.Fatal(err)
	}
	rule := "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100, algorithm: gcra, scope: global, home: %s}\n"
	store := "store:\n  url: redis://127.0.0.1:1\n  region: eu\n  regions:\n    us: {url: redis://127.0.0.1:2}\nenvoy:\n  config_dir: rl\n"
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(store), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		home, arg, want string
	}{
		{"us", cfg, "ok: envoy config_dir"},
		{"mars", cfg, "d.yaml:4: descriptors[0].rate_limit.home: unknown region 'mars'; valid: eu, us"},
		{"us", rl, "d.yaml:4: descriptors[0].rate_limit.scope: scope global needs serve's store.region and store.regions"},
	} {
		if err := os.WriteFile(filepath.Join(rl, "d.yaml"), []byte(fmt.Sprintf(rule, c.home)), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"config", "check", c.arg}, &out, &errOut)
		if got := out.String() + errOut.String(); !strings.Contains(got, c.want) || (err == nil) != strings.HasPrefix(c.want, "ok") {
			t.Errorf("home %s, check %s: err %v, want %q in:\n%s", c.home, c.arg, err, c.want, got)
		}
	}
}

// TestConfigCheckGlobalRLQSPolicy: sluice config check reads an RLQS
// policy's scope: global against the serve config's regions, as an Envoy
// rule's: with store.region and store.regions it is ok and its home must
// be one of them; without them it is an error at the policy's line.
func TestConfigCheckGlobalRLQSPolicy(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "rl"), 0o755); err != nil {
		t.Fatal(err)
	}
	rlqsSec := "rlqs:\n  domains:\n    - domain: envoy\n      policies:\n        - name: api\n          match: {route: api}\n          requests_per_unit: 100\n          unit: second\n          scope: global\n          home: %s\n"
	regions := "store:\n  url: redis://127.0.0.1:1\n  region: eu\n  regions:\n    us: {url: redis://127.0.0.1:2}\n"
	for _, c := range []struct {
		store, home, want string
	}{
		{regions, "us", "ok"},
		{regions, "mars", `sluice.yaml:16: rlqs.domains[0].policies[0].home: unknown region "mars"; valid: eu, us`},
		{"", "us", "sluice.yaml:10: rlqs.domains[0].policies[0].scope: global needs serve's store.region and store.regions"},
	} {
		cfg := filepath.Join(dir, "sluice.yaml")
		if err := os.WriteFile(cfg, []byte(c.store+"envoy: {config_dir: rl}\n"+fmt.Sprintf(rlqsSec, c.home)), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"config", "check", cfg}, &out, &errOut)
		if got := out.String() + errOut.String(); !strings.Contains(got, c.want) || (err == nil) != (c.want == "ok") {
			t.Errorf("store %q home %s: err %v, want %q in:\n%s", c.store, c.home, err, c.want, got)
		}
	}
}
