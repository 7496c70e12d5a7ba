package main

import (
	"bytes"
	"context"
	"runtime/debug"
	"strings"
	"testing"
)

func TestBuildVersion(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}}
	for _, c := range []struct {
		ld   string
		info *debug.BuildInfo
		want string
	}{
		{"", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"}}, "v0.3.0 (go1.26.8)"},
		{"", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs}, "devel (rev 0123456789ab, 2026-12-01T10:00:00Z, modified; go1.26.8)"},
		{"v1.2.3", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs[:1]}, "v1.2.3 (rev 0123456789ab; go1.26.8)"},
		{"", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}, "devel (no VCS revision"},
		{"", nil, "unknown"},
	} {
		if got := buildVersion(c.ld, c.info); !strings.HasPrefix(got, c.want) {
			t.Errorf("buildVersion(%q, %+v) = %q, want %q", c.ld, c.info, got, c.want)
		}
	}
}

// TestVersionFlagAndCommand checks that --version and `version` print the
// same line, with the Go version the binary was built with.
func TestVersionFlagAndCommand(t *testing.T) {
	var a, b bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, &a, &b); err != nil {
		t.Fatal(err)
	}
	var c bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &c, &b); err != nil {
		t.Fatal(err)
	}
	info, _ := debug.ReadBuildInfo()
	if a.String() != c.String() || !strings.HasPrefix(a.String(), "sluice ") || !strings.Contains(a.String(), info.GoVersion) {
		t.Errorf("--version %q, version %q", a.String(), c.String())
	}
}
