package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		if !strings.Contains(errOut.String(), "d.yaml") {
			t.Errorf("check %s: error does not name the file:\n%s", arg, errOut.String())
		}
	}
}
