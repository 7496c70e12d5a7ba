package deploytest

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestKubernetesManifests decodes every file of deploy/kubernetes strictly
// into the Kubernetes API types and checks them together (checkWorkload),
// and that kustomization.yaml lists every one of them.
func TestKubernetesManifests(t *testing.T) {
	const dir = "../kubernetes"
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	var o objects
	var listed []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := decodeAll(f, data, &o); err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == "kustomization.yaml" {
			var k struct {
				Resources []string `json:"resources"`
			}
			if err := yaml.Unmarshal(data, &k); err != nil {
				t.Fatal(err)
			}
			listed = k.Resources
		}
	}
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" && !slices.Contains(listed, b) {
			t.Errorf("kustomization.yaml does not list %s", b)
		}
	}
	if len(o.pdbs) != 1 || len(o.secrets) != 1 || len(o.configMaps) != 2 {
		t.Errorf("want 1 PodDisruptionBudget, 1 Secret, 2 ConfigMaps; have %d, %d, %d", len(o.pdbs), len(o.secrets), len(o.configMaps))
	}
	cfg := checkWorkload(t, dir, &o)
	checkRightByDefault(t, dir, &o, cfg, "local", chartSizing(t))
}

// TestStrictDecodeRejects proves that the decoding above is strict: a
// misspelt field and a wrong type in a manifest fail.
func TestStrictDecodeRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"misspelt field": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  selectr: {a: b}\n",
		"wrong type":     "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: three\n",
		"unknown kind":   "apiVersion: v1\nkind: Servce\nmetadata: {name: x}\n",
	} {
		var o objects
		if err := decodeAll(name, []byte(doc), &o); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}
