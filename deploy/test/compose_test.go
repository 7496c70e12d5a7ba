package deploytest

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	yamlv3 "gopkg.in/yaml.v3"

	"github.com/sluice-io/sluice/internal/config"
)

// composeFile is the part of the Compose specification the quickstart
// uses and that docker compose v2, docker-compose 1.29 and podman-compose
// 1.0.3 (Debian 12's) all read alike; decoding rejects any other field, so
// a typo fails the test, and so do a top-level name: (docker-compose 1.29
// rejects it) and a service's networks: (podman-compose 1.0.3 crashes on
// its aliases).
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   yamlv3.Node       `yaml:"depends_on"`
	Deploy      *struct {
		Replicas int `yaml:"replicas"`
	} `yaml:"deploy"`
	Healthcheck *struct {
		Test     []string `yaml:"test"`
		Interval string   `yaml:"interval"`
		Timeout  string   `yaml:"timeout"`
		Retries  int      `yaml:"retries"`
	} `yaml:"healthcheck"`
}

// replicas is the service's container count.
func (s composeService) replicas() int {
	if s.Deploy == nil || s.Deploy.Replicas == 0 {
		return 1
	}
	return s.Deploy.Replicas
}

// dependsOn lists a service's dependencies, in either of Compose's forms.
func (s composeService) dependsOn(t *testing.T) map[string]string {
	t.Helper()
	deps := map[string]string{}
	switch s.DependsOn.Kind {
	case 0:
	case yamlv3.SequenceNode:
		var l []string
		if err := s.DependsOn.Decode(&l); err != nil {
			t.Fatal(err)
		}
		for _, d := range l {
			deps[d] = "service_started"
		}
	case yamlv3.MappingNode:
		var m map[string]struct {
			Condition string `yaml:"condition"`
		}
		if err := s.DependsOn.Decode(&m); err != nil {
			t.Fatal(err)
		}
		for d, c := range m {
			deps[d] = c.Condition
		}
	default:
		t.Fatalf("depends_on is neither a list nor a map")
	}
	return deps
}

// mount finds the host file or directory mounted at target.
func (s composeService) mount(target string) (string, bool) {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == target {
			return parts[0], true
		}
	}
	return "", false
}

func strictYAML(t *testing.T, path string, into any) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return data
}

// TestCompose checks deploy/compose: the compose file's structure (every
// service has an image, every mounted file exists, dependencies name
// services, fixed host ports are unique and never on a replicated service),
// that sluice.yaml loads with sluice's own loader and uses the Redis
// service, that Envoy's bootstrap (deploy/envoy, checked against Envoy's
// types by internal/envoyrls) reaches the services it names on the ports
// they listen on, and the Prometheus and Grafana provisioning.
func TestCompose(t *testing.T) {
	const dir = "../compose"
	var cf composeFile
	strictYAML(t, filepath.Join(dir, "compose.yaml"), &cf)
	want := []string{"app", "envoy", "grafana", "prometheus", "redis", "sluice"}
	if got := keys(cf.Services); !sameSet(got, want) {
		t.Fatalf("services %v, want %v", got, want)
	}
	hostPorts := map[string]string{}
	names := map[string]bool{} // what resolves on the compose network: the service names
	for name, s := range cf.Services {
		names[name] = true
		if s.Image == "" {
			t.Errorf("%s: no image", name)
		}
		for dep := range s.dependsOn(t) {
			if _, ok := cf.Services[dep]; !ok {
				t.Errorf("%s: depends on unknown service %s", name, dep)
			}
		}
		for _, v := range s.Volumes {
			src := strings.Split(v, ":")[0]
			if _, err := os.Stat(filepath.Join(dir, src)); err != nil {
				t.Errorf("%s: volume %s: %v", name, v, err)
			}
		}
		for _, p := range s.Ports {
			host, _, fixed := strings.Cut(p, ":")
			if !fixed {
				continue // a free host port per container
			}
			if s.replicas() > 1 {
				t.Errorf("%s: %d replicas cannot all publish host port %s", name, s.replicas(), host)
			}
			if other, dup := hostPorts[host]; dup {
				t.Errorf("host port %s published by %s and %s", host, other, name)
			}
			hostPorts[host] = name
		}
	}

	// Two replicas of one service, sharing Redis, waiting for it to be
	// healthy; the service name resolves to both.
	s1 := cf.Services["sluice"]
	if s1.replicas() != 2 {
		t.Errorf("sluice runs %d replicas, want 2 sharing Redis", s1.replicas())
	}
	if s1.Build == nil || s1.Build.Dockerfile != "Dockerfile" {
		t.Error("sluice is not built from the repository's Dockerfile")
	} else if _, err := os.Stat(filepath.Join(dir, s1.Build.Context, s1.Build.Dockerfile)); err != nil {
		t.Errorf("sluice build: %v", err)
	}
	if s1.dependsOn(t)["redis"] != "service_healthy" || cf.Services["redis"].Healthcheck == nil {
		t.Error("sluice does not wait for a healthy Redis")
	}
	cfgPath := flagValue(s1.Command, "--config")
	src, ok := s1.mount(cfgPath)
	if !ok {
		t.Fatalf("sluice --config %s is not mounted", cfgPath)
	}
	cfg, err := config.Load(filepath.Join(dir, src))
	if err != nil {
		t.Fatalf("sluice config: %v", err)
	}
	if host := redisHost(cfg.Store.URL); !names[host] {
		t.Errorf("store.url %s names %q, not a compose service", cfg.Store.URL, host)
	}
	if cfg.Store.IsMemory() || cfg.Store.FailurePolicy != config.FailLocal {
		t.Errorf("store %s with failure_policy %s, want Redis with local", cfg.Store.URL, cfg.Store.FailurePolicy)
	}
	if cfg.File.Envoy == nil {
		t.Fatal("the quickstart's sluice has no envoy section")
	}
	rulesDir := filepath.Join(filepath.Dir(cfgPath), cfg.File.Envoy.ConfigDir)
	if rsrc, ok := s1.mount(rulesDir); !ok || filepath.Clean(rsrc) != "../envoy/ratelimit" {
		t.Errorf("envoy.config_dir %s is not deploy/envoy/ratelimit mounted (got %q)", rulesDir, rsrc)
	}

	// Envoy: deploy/envoy's bootstrap, whose clusters resolve here.
	envoy := cf.Services["envoy"]
	bootPath := flagValue(envoy.Command, "-c")
	bsrc, ok := envoy.mount(bootPath)
	if !ok || filepath.Clean(bsrc) != "../envoy/envoy.yaml" {
		t.Fatalf("envoy -c %s is not deploy/envoy/envoy.yaml mounted (got %q)", bootPath, bsrc)
	}
	var boot struct {
		StaticResources struct {
			Clusters []struct {
				Name           string `yaml:"name"`
				LoadAssignment struct {
					Endpoints []struct {
						LbEndpoints []struct {
							Endpoint struct {
								Address struct {
									SocketAddress struct {
										Address   string `yaml:"address"`
										PortValue int    `yaml:"port_value"`
									} `yaml:"socket_address"`
								} `yaml:"address"`
							} `yaml:"endpoint"`
						} `yaml:"lb_endpoints"`
					} `yaml:"endpoints"`
				} `yaml:"load_assignment"`
			} `yaml:"clusters"`
		} `yaml:"static_resources"`
	}
	data, _ := os.ReadFile(filepath.Join(dir, bsrc))
	if err := yamlv3.Unmarshal(data, &boot); err != nil {
		t.Fatal(err)
	}
	listens := map[string]string{ // what listens where, from the configs
		"sluice": portOf(cfg.File.Envoy.GRPCAddr),
		"app":    flagValue(cf.Services["app"].Command, "--port"),
	}
	for _, c := range boot.StaticResources.Clusters {
		for _, e := range c.LoadAssignment.Endpoints {
			for _, le := range e.LbEndpoints {
				sa := le.Endpoint.Address.SocketAddress
				if !names[sa.Address] {
					t.Errorf("envoy cluster %s: host %s is no compose service or alias", c.Name, sa.Address)
				}
				if got := listens[sa.Address]; got != itoa(sa.PortValue) {
					t.Errorf("envoy cluster %s: port %d, but %s listens on %q", c.Name, sa.PortValue, sa.Address, got)
				}
			}
		}
	}

	// Prometheus finds every replica by DNS, on sluice's listen port.
	var prom struct {
		Global        map[string]string `yaml:"global"`
		RuleFiles     []string          `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName      string `yaml:"job_name"`
			DNSSDConfigs []struct {
				Names           []string `yaml:"names"`
				Type            string   `yaml:"type"`
				Port            int      `yaml:"port"`
				RefreshInterval string   `yaml:"refresh_interval"`
			} `yaml:"dns_sd_configs"`
		} `yaml:"scrape_configs"`
	}
	strictYAML(t, filepath.Join(dir, "prometheus.yml"), &prom)
	var targets []string
	for _, sc := range prom.ScrapeConfigs {
		for _, sd := range sc.DNSSDConfigs {
			for _, n := range sd.Names {
				targets = append(targets, n+":"+itoa(sd.Port))
			}
			if sd.Type != "A" {
				t.Errorf("Prometheus dns_sd_configs type %q, want A (each replica's address)", sd.Type)
			}
		}
	}
	if wantTargets := []string{"sluice" + cfg.Listen}; !sameSet(targets, wantTargets) {
		t.Errorf("Prometheus targets %v, want %v", targets, wantTargets)
	}
	for _, rf := range prom.RuleFiles {
		if _, ok := cf.Services["prometheus"].mount(rf); !ok {
			t.Errorf("Prometheus rule file %s is not mounted", rf)
		}
	}

	// Grafana: the Prometheus data source, and deploy/grafana's dashboard
	// in the directory the provider reads.
	var ds struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct {
			Name      string `yaml:"name"`
			Type      string `yaml:"type"`
			UID       string `yaml:"uid"`
			Access    string `yaml:"access"`
			URL       string `yaml:"url"`
			IsDefault bool   `yaml:"isDefault"`
		} `yaml:"datasources"`
	}
	strictYAML(t, filepath.Join(dir, "grafana/datasources.yaml"), &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].URL != "http://prometheus:9090" || !ds.Datasources[0].IsDefault {
		t.Errorf("Grafana data sources %+v, want the default one at http://prometheus:9090", ds.Datasources)
	}
	var dp struct {
		APIVersion int `yaml:"apiVersion"`
		Providers  []struct {
			Name            string `yaml:"name"`
			Type            string `yaml:"type"`
			DisableDeletion bool   `yaml:"disableDeletion"`
			Options         struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	strictYAML(t, filepath.Join(dir, "grafana/dashboards.yaml"), &dp)
	graf := cf.Services["grafana"]
	if len(dp.Providers) != 1 {
		t.Fatalf("%d dashboard providers, want 1", len(dp.Providers))
	}
	dsrc, ok := graf.mount(dp.Providers[0].Options.Path)
	if !ok || filepath.Clean(dsrc) != "../grafana" {
		t.Errorf("deploy/grafana is not mounted at %s (got %q)", dp.Providers[0].Options.Path, dsrc)
	}
	for _, f := range []string{"datasources", "dashboards"} {
		found := false
		for _, v := range graf.Volumes {
			found = found || strings.Contains(v, ":/etc/grafana/provisioning/"+f+"/")
		}
		if !found {
			t.Errorf("Grafana %s provisioning is not mounted", f)
		}
	}
}

// TestComposeRejectsTypos proves the compose decoding is strict.
func TestComposeRejectsTypos(t *testing.T) {
	var cf composeFile
	dec := yamlv3.NewDecoder(strings.NewReader("services:\n  a:\n    image: x\n    volumes_from: [b]\n"))
	dec.KnownFields(true)
	if err := dec.Decode(&cf); err == nil {
		t.Error("an unknown service field decoded")
	}
}

func redisHost(url string) string {
	rest := url[strings.Index(url, "://")+3:]
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		rest = rest[at+1:]
	}
	host, _, _ := strings.Cut(rest, "/")
	h, _, err := net.SplitHostPort(host)
	if err != nil {
		return host
	}
	return h
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

func itoa(n int) string { return strconv.Itoa(n) }

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
