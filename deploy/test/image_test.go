package deploytest

import (
	"os"
	"regexp"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestOneImageName checks that every place that names the container image
// names the same one, the Makefile's SLUICE_IMAGE: what make image builds
// (and deploy/image's scripts default to), what the Kubernetes manifests
// and the Helm chart run, and what the Compose quickstart runs by default.
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
	want := find("../../Makefile", `(?m)^SLUICE_IMAGE \?= (\S+)$`)
	if want != "localhost/sluice:dev" {
		t.Errorf("Makefile: SLUICE_IMAGE ?= %s; the docs say localhost/sluice:dev", want)
	}
	if got := find("../../Makefile", `(?m)^IMAGE \?= (\S+)$`); got != "$(SLUICE_IMAGE)" {
		t.Errorf("Makefile: IMAGE ?= %s, want $(SLUICE_IMAGE)", got)
	}

	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(read("../helm/sluice/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	var values struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
	}
	if err := yaml.Unmarshal([]byte(read("../helm/sluice/values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	helm := values.Image.Repository + ":" + values.Image.Tag
	if values.Image.Tag == "" {
		helm = values.Image.Repository + ":" + chart.AppVersion
	}
	var rendered objects
	if err := decodeAll("helm", []byte(render(t, "{}")), &rendered); err != nil {
		t.Fatal(err)
	}
	var manifests objects
	if err := decodeAll("deployment.yaml", []byte(read("../kubernetes/deployment.yaml")), &manifests); err != nil {
		t.Fatal(err)
	}
	for what, got := range map[string]string{
		"deploy/helm values":            helm,
		"deploy/helm rendered":          rendered.deployments[0].Spec.Template.Spec.Containers[0].Image,
		"deploy/kubernetes":             manifests.deployments[0].Spec.Template.Spec.Containers[0].Image,
		"deploy/compose":                find("../compose/compose.yaml", `image: \$\{SLUICE_IMAGE:-([^}]+)\}`),
		"deploy/image/build.sh default": find("../image/build.sh", `image=\$\{2:-\$\{SLUICE_IMAGE:-([^}]+)\}\}`),
		"deploy/image/test.sh default":  find("../image/test.sh", `image=\$\{1:-\$\{SLUICE_IMAGE:-([^}]+)\}\}`),
		"Dockerfile's build comment":    find("../../Dockerfile", `docker build -t (\S+) \.`),
	} {
		if got != want {
			t.Errorf("%s names the image %s, the Makefile's SLUICE_IMAGE %s", what, got, want)
		}
	}
}
