package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3"
// (make static does); otherwise the module version recorded by the Go
// toolchain is used, such as v0.3.0 for `go install ...@v0.3.0`.
var version = ""

// versionString is "v1.2.3 (rev 0123abcd4567, 2026-12-02T14:00:00Z,
// modified; go1.26.8)": the module version and the VCS revision, time and
// dirty flag that `go build` records in the binary, as far as known.
func versionString() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return buildVersion(version, nil)
	}
	return buildVersion(version, info)
}

func buildVersion(ldVersion string, info *debug.BuildInfo) string {
	v := ldVersion
	if info == nil {
		if v == "" {
			v = "unknown (no build information)"
		}
		return v
	}
	if v == "" {
		v = info.Main.Version
	}
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	var parts []string
	if rev := settings["vcs.revision"]; rev != "" {
		parts = append(parts, "rev "+rev[:min(12, len(rev))])
		if t := settings["vcs.time"]; t != "" {
			parts = append(parts, t)
		}
		if settings["vcs.modified"] == "true" {
			parts = append(parts, "modified")
		}
	} else if v == "devel" {
		parts = append(parts, "no VCS revision: built outside a git checkout or with -buildvcs=false")
	}
	out := v + " ("
	if len(parts) > 0 {
		out += strings.Join(parts, ", ") + "; "
	}
	return out + info.GoVersion + ")"
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the sluice version: module version, VCS revision and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "sluice %s\n", versionString())
			return err
		},
	}
}
