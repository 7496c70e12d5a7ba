package deploytest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/envoyrls"
	"github.com/sluice-io/sluice/internal/gateway"
)

// checkConfigMapsHoldRulesOnly fails when a ConfigMap holds anything but
// envoyproxy/ratelimit rules: the chart keeps sluice's config, with its
// key and admin token hashes, in a Secret.
func checkConfigMapsHoldRulesOnly(t *testing.T, name string, o *objects) {
	t.Helper()
	for cmName, cm := range o.configMaps {
		for k, body := range cm.Data {
			if config.Detect([]byte(body)) != config.KindEnvoy {
				t.Errorf("%s: ConfigMap %s holds %s, not envoyproxy/ratelimit rules: sluice's config, with its key hashes, belongs in a Secret", name, cmName, k)
			}
		}
	}
}

// gatewayKeyEnvs lists the variables a gateway config reads upstream keys
// from, but those of upstreams that need none.
func gatewayKeyEnvs(gw *gateway.Config) []string {
	var out []string
	if len(gw.Upstreams) == 0 {
		if !gw.Upstream.AllowNoKey && gw.Upstream.APIKeyEnv != "" {
			out = append(out, gw.Upstream.APIKeyEnv)
		}
		return out
	}
	for _, u := range gw.Upstreams {
		if !u.AllowNoKey && u.KeyEnv != "" {
			out = append(out, u.KeyEnv)
		}
	}
	return out
}

// objects is a set of decoded Kubernetes objects, by kind.
type objects struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	pdbs        []*policyv1.PodDisruptionBudget
	monitors    []*monitoringv1.ServiceMonitor
}

// decodeAll splits a YAML stream into documents and decodes each strictly
// (an unknown or misspelt field is an error) into its Kubernetes API type.
func decodeAll(name string, stream []byte, into *objects) error {
	if into.configMaps == nil {
		into.configMaps, into.secrets = map[string]*corev1.ConfigMap{}, map[string]*corev1.Secret{}
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			d := &appsv1.Deployment{}
			into.deployments, obj = append(into.deployments, d), d
		case "v1 Service":
			s := &corev1.Service{}
			into.services, obj = append(into.services, s), s
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1 Secret":
			obj = &corev1.Secret{}
		case "policy/v1 PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			into.pdbs, obj = append(into.pdbs, p), p
		case "monitoring.coreos.com/v1 ServiceMonitor":
			m := &monitoringv1.ServiceMonitor{}
			into.monitors, obj = append(into.monitors, m), m
		case "kustomize.config.k8s.io/v1beta1 Kustomization":
			continue
		default:
			return fmt.Errorf("%s: document %d: unexpected %s %s: %q", name, i, tm.APIVersion, tm.Kind, doc)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return fmt.Errorf("%s: %s (document %d) does not decode strictly: %w", name, tm.Kind, i, err)
		}
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			into.configMaps[o.Name] = o
		case *corev1.Secret:
			into.secrets[o.Name] = o
		}
	}
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if tl := bytes.TrimSpace(l); !bytes.HasPrefix(tl, []byte("#")) && !bytes.Equal(tl, []byte("---")) {
			out = append(append(out, l...), '\n')
		}
	}
	return out
}

// checkWorkload checks what must hold between the objects of one install:
// the sluice container's config (from its ConfigMap) loads with sluice's
// own loader, its envoy rules directory loads too, the probes hit /readyz
// and /healthz on the config's listen port, the Redis URL comes from a
// Secret that exists, resources are requested, and the Service, PDB and
// ServiceMonitor select the pods.
func checkWorkload(t *testing.T, name string, o *objects) *config.Config {
	t.Helper()
	if len(o.deployments) != 1 {
		t.Fatalf("%s: %d Deployments, want 1", name, len(o.deployments))
	}
	d := o.deployments[0]
	pod := d.Spec.Template
	podLabels := labels.Set(pod.Labels)
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		t.Errorf("%s: Deployment selector %v does not match its pods' labels %v", name, d.Spec.Selector, pod.Labels)
	}
	if pod.Spec.SecurityContext == nil || pod.Spec.SecurityContext.RunAsNonRoot == nil || !*pod.Spec.SecurityContext.RunAsNonRoot {
		t.Errorf("%s: pods may run as root", name)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", name, len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]

	// The config file the container reads, from the mounted ConfigMap or
	// Secret.
	cfgPath := flagValue(c.Args, "--config")
	volumeFiles := mountedFiles(t, name, pod.Spec, c, o)
	data, ok := volumeFiles[cfgPath]
	if !ok {
		t.Fatalf("%s: --config %s is in no mounted ConfigMap or Secret (have %v)", name, cfgPath, keys(volumeFiles))
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Setenv(e.Name, e.Value)
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		s, ok := o.secrets[ref.Name]
		if !ok {
			// A Secret of the user's own: a value of the variable's kind.
			v := "redis://from-an-existing-secret:6379/0"
			if e.Name != "SLUICE_REDIS_URL" && !strings.HasPrefix(e.Name, "SLUICE_REGION_") {
				v = "sk-from-an-existing-secret-0123456789abcdef"
			}
			t.Setenv(e.Name, v)
			continue
		}
		v, ok := secretData(s)[ref.Key]
		if !ok {
			t.Errorf("%s: env %s: Secret %s has no key %q", name, e.Name, ref.Name, ref.Key)
		}
		t.Setenv(e.Name, v)
	}
	cfg, err := config.Parse(cfgPath, []byte(data))
	if err != nil {
		t.Fatalf("%s: the mounted sluice config does not load: %v", name, err)
	}
	if gw := cfg.File.Gateway; gw != nil {
		// Every key variable the gateway reads comes from a Secret, and the
		// gateway's own check of them (as sluice serve runs it) passes.
		if err := gateway.CheckKeys(gw, os.Getenv, os.ReadFile); err != nil {
			t.Errorf("%s: gateway keys: %v", name, err)
		}
		for _, env := range gatewayKeyEnvs(gw) {
			if !hasSecretEnv(c, env) {
				t.Errorf("%s: the gateway reads its upstream key from $%s, which is not set from a Secret", name, env)
			}
		}
	}
	if cfg.Store.URL != "memory" && cfg.Store.Instances != int(*d.Spec.Replicas) {
		t.Errorf("%s: store.instances %d != replicas %d (failure_policy local divides by it)", name, cfg.Store.Instances, *d.Spec.Replicas)
	}
	if env := cfg.File.Store.URLEnv; env != "" && !hasSecretEnv(c, env) {
		t.Errorf("%s: store.url_env %s is not set from a Secret", name, env)
	}
	if sec := cfg.File.Envoy; sec != nil {
		dir := t.TempDir()
		n := 0
		for p, body := range volumeFiles {
			if filepath.Dir(p) == sec.ConfigDir {
				n++
				if err := os.WriteFile(filepath.Join(dir, filepath.Base(p)), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: envoy.config_dir %s has no mounted files", name, sec.ConfigDir)
		} else if _, err := envoyrls.CheckDir(dir, sec.MergeDomains); err != nil {
			t.Errorf("%s: envoy rules: %v", name, err)
		}
	}

	listenPort := strings.TrimPrefix(cfg.Listen, ":")
	httpPort := ""
	for _, p := range c.Ports {
		if p.Name == "http" {
			httpPort = fmt.Sprint(p.ContainerPort)
		}
	}
	if httpPort != listenPort {
		t.Errorf("%s: container port http %s, but sluice listens on %q", name, httpPort, cfg.Listen)
	}
	for _, pr := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil || pr.probe.HTTPGet.Path != pr.path || pr.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("%s: %s probe is not GET %s on port http: %+v", name, pr.what, pr.path, pr.probe)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("%s: no CPU/memory requests", name)
	}

	if len(o.services) != 1 {
		t.Fatalf("%s: %d Services, want 1", name, len(o.services))
	}
	svc := o.services[0]
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("%s: Service selector %v does not match the pods", name, svc.Spec.Selector)
	}
	for _, p := range svc.Spec.Ports {
		if !hasPortName(c, p.TargetPort.String()) {
			t.Errorf("%s: Service port %s targets %s, which the container does not name", name, p.Name, p.TargetPort.String())
		}
	}
	for _, pdb := range o.pdbs {
		s, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || !s.Matches(podLabels) {
			t.Errorf("%s: PodDisruptionBudget does not select the pods", name)
		}
		if *d.Spec.Replicas < 2 {
			t.Errorf("%s: a PodDisruptionBudget for %d replica blocks every node drain", name, *d.Spec.Replicas)
		}
		if pdb.Spec.MinAvailable != nil && pdb.Spec.MinAvailable.IntValue() >= int(*d.Spec.Replicas) {
			t.Errorf("%s: PodDisruptionBudget minAvailable %v leaves no room to drain %d replicas", name, pdb.Spec.MinAvailable, *d.Spec.Replicas)
		}
	}
	for _, m := range o.monitors {
		s, err := metav1.LabelSelectorAsSelector(&m.Spec.Selector)
		if err != nil || !s.Matches(labels.Set(svc.Labels)) {
			t.Errorf("%s: ServiceMonitor does not select the Service", name)
		}
		if len(m.Spec.Endpoints) != 1 || m.Spec.Endpoints[0].Port != "http" || m.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("%s: ServiceMonitor endpoints %+v, want port http path /metrics", name, m.Spec.Endpoints)
		}
	}
	return cfg
}

// mountedFiles maps each file path the container sees from a ConfigMap or
// Secret volume to its content.
func mountedFiles(t *testing.T, name string, spec corev1.PodSpec, c corev1.Container, o *objects) map[string]string {
	t.Helper()
	files := map[string]string{}
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name != m.Name || (v.ConfigMap == nil && v.Secret == nil) {
				continue
			}
			if m.SubPath != "" {
				t.Errorf("%s: volume %s is mounted with subPath: ConfigMap and Secret updates never reach it", name, v.Name)
			}
			var data map[string]string
			var items []corev1.KeyToPath
			if v.ConfigMap != nil {
				cm, ok := o.configMaps[v.ConfigMap.Name]
				if !ok {
					t.Fatalf("%s: volume %s: no ConfigMap %s", name, v.Name, v.ConfigMap.Name)
				}
				data, items = cm.Data, v.ConfigMap.Items
			} else {
				sec, ok := o.secrets[v.Secret.SecretName]
				if !ok {
					t.Fatalf("%s: volume %s: no Secret %s", name, v.Name, v.Secret.SecretName)
				}
				data, items = secretData(sec), v.Secret.Items
			}
			if len(items) == 0 {
				for k, body := range data {
					files[filepath.Join(m.MountPath, k)] = body
				}
			}
			for _, it := range items {
				files[filepath.Join(m.MountPath, it.Path)] = data[it.Key]
			}
		}
	}
	return files
}

// secretData is a Secret's content, stringData over data, as the API
// server merges them.
func secretData(s *corev1.Secret) map[string]string {
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	for k, v := range s.StringData {
		out[k] = v
	}
	return out
}

func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func hasSecretEnv(c corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return true
		}
	}
	return false
}

func hasPortName(c corev1.Container, name string) bool {
	for _, p := range c.Ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
