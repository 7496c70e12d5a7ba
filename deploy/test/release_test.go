package deploytest

import (
	"bytes"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/rhysd/actionlint"
	"github.com/santhosh-tekuri/jsonschema/v6"
	yamlv3 "gopkg.in/yaml.v3"
	"sigs.k8s.io/yaml"
)

const (
	releaseWorkflow = "../../.github/workflows/release.yml"
	releaseConfig   = "../../.goreleaser.yaml"
	// goreleaserSchema is GoReleaser's own JSON schema of its config
	// (testdata/goreleaser-v2.17.1.schema.NOTICE): generated from its
	// pkg/config types with additionalProperties false, so an unknown or
	// misspelt key fails as `goreleaser check` fails it. GoReleaser
	// itself is not built here: its module brings every cloud SDK.
	goreleaserSchema = "testdata/goreleaser-v2.17.1.schema.json"
	// publishedImage is what the release publishes and the chart and
	// manifests run, with the version as the tag.
	publishedImage = "ghcr.io/sluice-io/sluice"
	chartRegistry  = "oci://ghcr.io/sluice-io/charts"
)

// lintWorkflow runs actionlint (github.com/rhysd/actionlint, its library:
// workflow syntax, expressions, contexts, permissions, the inputs of the
// actions it knows; shellcheck is not run) over one workflow file.
func lintWorkflow(t *testing.T, path string, content []byte) []*actionlint.Error {
	t.Helper()
	l, err := actionlint.NewLinter(io.Discard, &actionlint.LinterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	errs, err := l.Lint(path, content, nil)
	if err != nil {
		t.Fatalf("actionlint: %v", err)
	}
	return errs
}

// TestReleaseWorkflow lints .github/workflows/release.yml with actionlint
// and checks that it releases what the docs promise: on a v* tag,
// GoReleaser with .goreleaser.yaml, and the chart pushed to the OCI
// registry with the tag's version as its version and appVersion (so that
// the chart runs the image GoReleaser pushed).
func TestReleaseWorkflow(t *testing.T) {
	data, err := os.ReadFile(releaseWorkflow)
	if err != nil {
		t.Fatal(err)
	}
	// The toggle: actionlint reports a broken expression and an unknown key.
	broken := bytes.Replace(data, []byte("${{ github.ref_name }}"), []byte("${{ github.ref_nam }}"), 1)
	broken = bytes.Replace(broken, []byte("runs-on:"), []byte("run-on:"), 1)
	if errs := lintWorkflow(t, releaseWorkflow, broken); len(errs) < 2 {
		t.Fatalf("actionlint let a broken workflow pass: %v", errs)
	}
	for _, e := range lintWorkflow(t, releaseWorkflow, data) {
		t.Errorf("%s:%d:%d: %s [%s]", releaseWorkflow, e.Line, e.Column, e.Message, e.Kind)
	}

	// yaml.v3, not sigs.k8s.io/yaml: YAML 1.1 reads the key "on" as true.
	var wf struct {
		On struct {
			Push struct {
				Tags []string `yaml:"tags"`
			} `yaml:"push"`
		} `yaml:"on"`
		Permissions map[string]string `yaml:"permissions"`
		Jobs        map[string]struct {
			Steps []struct {
				Uses string            `yaml:"uses"`
				With map[string]string `yaml:"with"`
				Run  string            `yaml:"run"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yamlv3.Unmarshal(data, &wf); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(wf.On.Push.Tags, "v*.*.*") {
		t.Errorf("on.push.tags %v: a release runs on a v*.*.* tag", wf.On.Push.Tags)
	}
	if wf.Permissions["packages"] != "write" || wf.Permissions["contents"] != "write" {
		t.Errorf("permissions %v: pushing to ghcr.io needs packages: write, the release contents: write", wf.Permissions)
	}
	var goreleaser, chart bool
	for _, job := range wf.Jobs {
		for _, s := range job.Steps {
			if strings.HasPrefix(s.Uses, "goreleaser/goreleaser-action@") && strings.Contains(s.With["args"], "release") {
				goreleaser = true
			}
			if strings.Contains(s.Run, "helm push") && strings.Contains(s.Run, chartRegistry) &&
				strings.Contains(s.Run, `--app-version "$version"`) && strings.Contains(s.Run, `--version "$version"`) {
				chart = true
			}
		}
	}
	if !goreleaser || !chart {
		t.Errorf("release.yml: GoReleaser release step %v, chart pushed to %s with the tag's version as version and appVersion %v", goreleaser, chartRegistry, chart)
	}
}

// TestReleaseConfig validates .goreleaser.yaml against GoReleaser's own
// schema (strictly: a misspelt key fails, as the toggle shows) and checks
// what a release must carry: static binaries for linux and darwin on amd64
// and arm64, checksums, SBOMs, and a multi-arch image under the name the
// chart and manifests run (TestOneImageName).
func TestReleaseConfig(t *testing.T) {
	raw, err := os.ReadFile(releaseConfig)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(goreleaserSchema)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	schemaDoc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("goreleaser.schema.json", schemaDoc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("goreleaser.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	validate := func(doc []byte) error {
		t.Helper()
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatal(err)
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
		if err != nil {
			t.Fatal(err)
		}
		return sch.Validate(inst)
	}
	if err := validate(bytes.Replace(raw, []byte("platforms:"), []byte("platfroms:"), 1)); err == nil {
		t.Fatal("the schema let a misspelt key (kos[0].platfroms) pass")
	}
	if err := validate(raw); err != nil {
		t.Fatalf("%s does not validate against GoReleaser's schema: %v", releaseConfig, err)
	}

	var cfg struct {
		Version int `json:"version"`
		Builds  []struct {
			ID     string   `json:"id"`
			Main   string   `json:"main"`
			Env    []string `json:"env"`
			Goos   []string `json:"goos"`
			Goarch []string `json:"goarch"`
		} `json:"builds"`
		Checksum struct {
			NameTemplate string `json:"name_template"`
		} `json:"checksum"`
		Sboms []struct {
			Artifacts string `json:"artifacts"`
		} `json:"sboms"`
		Kos []struct {
			Build        string   `json:"build"`
			Repositories []string `json:"repositories"`
			Bare         bool     `json:"bare"`
			Tags         []string `json:"tags"`
			Platforms    []string `json:"platforms"`
		} `json:"kos"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Version != 2 {
		t.Errorf("version %d: the config is GoReleaser v2's", cfg.Version)
	}
	if len(cfg.Builds) != 1 || cfg.Builds[0].Main != "./cmd/sluice" || !slices.Contains(cfg.Builds[0].Env, "CGO_ENABLED=0") {
		t.Fatalf("builds %+v: want one static build of ./cmd/sluice", cfg.Builds)
	}
	b := cfg.Builds[0]
	for _, want := range [][2]string{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}} {
		if !slices.Contains(b.Goos, want[0]) || !slices.Contains(b.Goarch, want[1]) {
			t.Errorf("no %s/%s binary (goos %v, goarch %v)", want[0], want[1], b.Goos, b.Goarch)
		}
	}
	if cfg.Checksum.NameTemplate == "" || len(cfg.Sboms) == 0 || cfg.Sboms[0].Artifacts != "archive" {
		t.Errorf("checksum %+v, sboms %+v: a release carries checksums and an SBOM of each archive", cfg.Checksum, cfg.Sboms)
	}
	if len(cfg.Kos) != 1 {
		t.Fatalf("%d ko images, want 1", len(cfg.Kos))
	}
	ko := cfg.Kos[0]
	if ko.Build != b.ID || !ko.Bare || !slices.Equal(ko.Repositories, []string{publishedImage}) || !slices.Contains(ko.Tags, "{{ .Version }}") {
		t.Errorf("kos %+v: want the build %q as %s:{{ .Version }} (bare)", ko, b.ID, publishedImage)
	}
	if !slices.Contains(ko.Platforms, "linux/amd64") || !slices.Contains(ko.Platforms, "linux/arm64") {
		t.Errorf("image platforms %v, want linux/amd64 and linux/arm64", ko.Platforms)
	}
}
