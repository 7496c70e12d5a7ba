// Package configmaptest lays out a directory the way the kubelet lays out a
// mounted Kubernetes ConfigMap, and updates it the same way, so that tests
// can check that file watchers follow a ConfigMap update.
//
// The kubelet (pkg/volume/util/atomic_writer.go) writes each version into a
// fresh hidden directory ..<timestamp>, points the symlink ..data at it, and
// links every visible name to ..data/<name>. An update writes a new
// timestamped directory, creates the symlink ..data_tmp to it, renames
// ..data_tmp over ..data (the atomic step) and removes the old directory.
// The visible files never change: only ..data does.
package configmaptest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Dir is a ConfigMap mount being updated.
type Dir struct {
	// Path is the mount point.
	Path    string
	t       testing.TB
	version int
	current string
}

// New lays out files (name → content) in a new directory under
// t.TempDir(). Names may contain one level of subdirectory, as a
// ConfigMap's items paths may.
func New(t testing.TB, files map[string]string) *Dir {
	t.Helper()
	d := &Dir{Path: t.TempDir(), t: t}
	d.Update(files)
	return d
}

// Update swaps in a new version of the files, as the kubelet does.
func (d *Dir) Update(files map[string]string) {
	t := d.t
	t.Helper()
	d.version++
	ts := fmt.Sprintf("..2026_12_02_15_00_%02d.%d", d.version, d.version)
	for name, content := range files {
		p := filepath.Join(d.Path, ts, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(d.Path, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.Path, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		top, _, _ := strings.Cut(name, "/")
		link := filepath.Join(d.Path, top)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", top), link); err != nil {
			t.Fatal(err)
		}
	}
	if d.current != "" {
		if err := os.RemoveAll(filepath.Join(d.Path, d.current)); err != nil {
			t.Fatal(err)
		}
	}
	d.current = ts
}
