// Package nodesdk installs an official SDK from npm, pinned exactly, for
// tests that drive sluice with it: once per version under the user's cache
// directory, reused by later runs, never written into the repository.
package nodesdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Dir returns node's path and a directory holding node_modules/<pkg> at
// version. It skips the test, saying why, when node or npm is missing or
// the install fails (no registry).
func Dir(t testing.TB, pkg, version string) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node not found (%v): this test runs the official %s SDK with Node.js and npm", err, pkg)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Skipf("no user cache directory for the npm install: %v", err)
	}
	root := filepath.Join(cache, "sluice-node-sdk")
	dir = filepath.Join(root, strings.ReplaceAll(pkg, "/", "+")+"@"+version)
	if Installed(dir, pkg) == version {
		return node, dir
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skipf("npm not found (%v): needed to install %s@%s", err, pkg, version)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Skipf("npm install: %v", err)
	}
	// Install into a fresh directory and rename it into place, so that
	// concurrent test processes never see a half-installed package.
	tmp, err := os.MkdirTemp(root, "install-")
	if err != nil {
		t.Skipf("npm install: %v", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, "package.json"), []byte(`{"private":true,"type":"module"}`+"\n"), 0o644); err != nil {
		t.Skipf("npm install: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error", "--save-exact", pkg+"@"+version)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("npm install %s@%s failed (registry unreachable?): %v\n%s", pkg, version, err, out)
	}
	if v := Installed(tmp, pkg); v != version {
		t.Fatalf("npm installed %s %q, want %s", pkg, v, version)
	}
	if err := os.Rename(tmp, dir); err != nil && Installed(dir, pkg) != version {
		t.Fatalf("npm install: %v", err)
	}
	return node, dir
}

// Installed is the version of node_modules/<pkg> under dir, or "".
func Installed(dir, pkg string) string {
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", filepath.FromSlash(pkg), "package.json"))
	if err != nil {
		return ""
	}
	var p struct{ Version string }
	if json.Unmarshal(b, &p) != nil {
		return ""
	}
	return p.Version
}

// Run runs script as an ES module resolved from dir (so that its imports
// find the cached install), with env added, and returns what it printed
// on stdout. It skips the test when node does not start.
func Run(t testing.TB, node, dir string, script []byte, env ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--input-type=module", "-")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(script)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Skipf("node did not start: %v", err)
		}
		t.Fatalf("node: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	return stdout.Bytes()
}
