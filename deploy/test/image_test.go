package deploytest

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestOneImageName checks that every place that names the container image
// names one of two: the local build, the Makefile's SLUICE_IMAGE
// (localhost/sluice:dev: what make image builds, deploy/image's scripts
// default to and the Compose quickstart runs by default), and the
// published image, what the release publishes (.goreleaser.yaml's ko
// image, ghcr.io/sluice-io/sluice:<version>) and the Kubernetes manifests
// and the Helm chart run, at the chart's appVersion.
func TestOneImageName(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	find := func(path, pattern string) string {
		t.Helper()
		m := regexp.MustCompile(pattern).FindStringSubmatch(read(path))
		if m == nil {
			t.Fatalf("%s: no match for %s", path, pattern)
		}
		return m[1]
	}
	local := find("../../Makefile", `(?m)^SLUICE_IMAGE \?= (\S+)$`)
	if local != "localhost/sluice:dev" {
		t.Errorf("Makefile: SLUICE_IMAGE ?= %s; the docs say localhost/sluice:dev", local)
	}
	if got := find("../../Makefile", `(?m)^IMAGE \?= (\S+)$`); got != "$(SLUICE_IMAGE)" {
		t.Errorf("Makefile: IMAGE ?= %s, want $(SLUICE_IMAGE)", got)
	}
	for what, got := range map[string]string{
		"deploy/compose":                find("../compose/compose.yaml", `image: \$\{SLUICE_IMAGE:-([^}]+)\}`),
		"deploy/image/build.sh default": find("../image/build.sh", `image=\$\{2:-\$\{SLUICE_IMAGE:-([^}]+)\}\}`),
		"deploy/image/test.sh default":  find("../image/test.sh", `image=\$\{1:-\$\{SLUICE_IMAGE:-([^}]+)\}\}`),
		"Dockerfile's build comment":    find("../../Dockerfile", `docker build -t (\S+) \.`),
	} {
		if got != local {
			t.Errorf("%s names the image %s, the Makefile's SLUICE_IMAGE %s", what, got, local)
		}
	}

	// The published name: .goreleaser.yaml's ko image, tagged with the
	// version (TestReleaseConfig checks the tag template), which the
	// workflow also gives the chart as its appVersion.
	var release struct {
		Kos []struct {
			Repositories []string `json:"repositories"`
		} `json:"kos"`
	}
	if err := yaml.Unmarshal([]byte(read(releaseConfig)), &release); err != nil {
		t.Fatal(err)
	}
	if len(release.Kos) != 1 || len(release.Kos[0].Repositories) != 1 || release.Kos[0].Repositories[0] != publishedImage {
		t.Fatalf(".goreleaser.yaml publishes %+v, want %s", release.Kos, publishedImage)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
		Version    string `json:"version"`
	}
	if err := yaml.Unmarshal([]byte(read("../helm/sluice/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(chart.AppVersion) {
		t.Errorf("Chart.yaml appVersion %q: the image tag GoReleaser gives a release, X.Y.Z", chart.AppVersion)
	}
	published := publishedImage + ":" + chart.AppVersion
	var values struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
	}
	if err := yaml.Unmarshal([]byte(read("../helm/sluice/values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	if values.Image.Tag != "" {
		t.Errorf("values.yaml image.tag %q: leave it empty, the chart's appVersion is the release's tag", values.Image.Tag)
	}
	var rendered objects
	if err := decodeAll("helm", []byte(render(t, "{}")), &rendered); err != nil {
		t.Fatal(err)
	}
	var manifests objects
	if err := decodeAll("deployment.yaml", []byte(read("../kubernetes/deployment.yaml")), &manifests); err != nil {
		t.Fatal(err)
	}
	var dev objects
	if err := decodeAll("helm dev", []byte(render(t, "image: {repository: localhost/sluice, tag: dev}")), &dev); err != nil {
		t.Fatal(err)
	}
	for what, got := range map[string]string{
		"deploy/helm values":                values.Image.Repository + ":" + chart.AppVersion,
		"deploy/helm rendered":              rendered.deployments[0].Spec.Template.Spec.Containers[0].Image,
		"deploy/kubernetes":                 manifests.deployments[0].Spec.Template.Spec.Containers[0].Image,
		"deploy/helm with the dev override": strings.Replace(dev.deployments[0].Spec.Template.Spec.Containers[0].Image, local, published, 1),
	} {
		if got != published {
			t.Errorf("%s runs the image %s, the release publishes %s", what, got, published)
		}
	}
}
