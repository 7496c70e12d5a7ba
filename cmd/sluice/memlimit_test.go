package main

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

// TestCgroupMemoryLimit: the container's memory limit is read from
// cgroup v2 and v1 files as the kernel writes them
// (Documentation/admin-guide/cgroup-v2.rst, memory.max: a number of bytes
// or "max"; cgroup-v1/memory.rst: limit_in_bytes, 9223372036854771712
// when unlimited).
func TestCgroupMemoryLimit(t *testing.T) {
	write := func(dir, name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, c := range []struct {
		name string
		root string
		want int64
	}{
		{"v2 limit", write(t.TempDir(), "memory.max", "268435456\n"), 256 << 20},
		{"v2 none", write(t.TempDir(), "memory.max", "max\n"), 0},
		{"v1 limit", write(t.TempDir(), "memory/memory.limit_in_bytes", "268435456\n"), 256 << 20},
		{"v1 none", write(t.TempDir(), "memory/memory.limit_in_bytes", "9223372036854771712\n"), 0},
		{"no cgroup", t.TempDir(), 0},
	} {
		got, ok := cgroupMemoryLimit(c.root)
		if got != c.want || ok != (c.want != 0) {
			t.Errorf("%s: %d %v, want %d", c.name, got, ok, c.want)
		}
	}
	// GOMEMLIMIT set by the operator wins; else 90 % of the limit.
	t.Setenv("GOMEMLIMIT", "100MiB")
	if got := setMemoryLimit(write(t.TempDir(), "memory.max", "268435456\n")); got != 0 {
		t.Errorf("with GOMEMLIMIT set: set %d", got)
	}
	t.Setenv("GOMEMLIMIT", "")
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	if got := setMemoryLimit(write(t.TempDir(), "memory.max", "268435456\n")); got != 241591910 || debug.SetMemoryLimit(-1) != got {
		t.Errorf("set %d (runtime %d), want 241591910", got, debug.SetMemoryLimit(-1))
	}
}
