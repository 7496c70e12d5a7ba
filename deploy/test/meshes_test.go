package deploytest

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	egvalidation "github.com/envoyproxy/gateway/api/v1alpha1/validation"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3" // HttpProtocolOptions, in the cluster's Any
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istioapi "istio.io/api/networking/v1alpha3"
	istioclient "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The sluice these examples point at: the Helm chart, release rl in
// namespace sluice, with envoy.enabled.
const (
	sluiceHost = "rl-sluice.sluice.svc.cluster.local"
	rlsPort    = 8081
)

// validator is what protoc-gen-validate generates on Envoy's messages.
type validator interface{ ValidateAll() error }

// envoyJSON decodes JSON into an Envoy message strictly (protojson rejects
// unknown fields, and resolves Any by the registered types) and runs its
// generated validation when it has one.
func envoyJSON(data []byte, m proto.Message) error {
	if err := protojson.Unmarshal(data, m); err != nil {
		return fmt.Errorf("%T: %w", m, err)
	}
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%T: %w", m, err)
		}
	}
	return nil
}

// splitYAML splits a file into its documents.
func splitYAML(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	for _, d := range strings.Split(string(data), "\n---\n") {
		if strings.TrimSpace(string(stripComments([]byte(d)))) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// checkRateLimitFilter checks the rate limit filter's config: the domain
// has rules in the chart's default Envoy rules, and the service is the
// named cluster.
func checkRateLimitFilter(t *testing.T, f *hcmv3.HttpFilter, wantCluster string, domains map[string][]string) {
	t.Helper()
	if f.GetName() != "envoy.filters.http.ratelimit" {
		t.Errorf("filter %q, want envoy.filters.http.ratelimit", f.GetName())
	}
	var rl ratelimitv3.RateLimit
	if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatalf("typed_config: %v", err)
	}
	if _, ok := domains[rl.GetDomain()]; !ok {
		t.Errorf("domain %q has no rules in the chart's envoy.rules (have %v)", rl.GetDomain(), keys(domains))
	}
	if got := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != wantCluster {
		t.Errorf("rate limit service cluster %q, want %q", got, wantCluster)
	}
	if rl.GetFailureModeDeny() {
		t.Error("failure_mode_deny: true turns every sluice outage into 500s; sluice's local policy already answers while Redis is away")
	}
}

// checkActions checks that each rate limit's descriptor keys have a rule
// at the top of the domain.
func checkActions(t *testing.T, rls []*routev3.RateLimit, rules []string) {
	t.Helper()
	if len(rls) == 0 {
		t.Fatal("no rate_limits: no descriptor is sent")
	}
	for _, r := range rls {
		for _, a := range r.GetActions() {
			var key string
			switch {
			case a.GetRemoteAddress() != nil:
				key = "remote_address"
			case a.GetGenericKey() != nil:
				key = cmpOr(a.GetGenericKey().GetDescriptorKey(), "generic_key")
			case a.GetRequestHeaders() != nil:
				key = a.GetRequestHeaders().GetDescriptorKey()
			default:
				t.Errorf("action %v: unchecked kind", a)
				continue
			}
			if !slices.Contains(rules, key) {
				t.Errorf("descriptor key %s has no rule in the domain (rules %v)", key, rules)
			}
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// chartRules renders the chart with envoy.enabled and returns the Envoy
// rule files' domains and their top-level descriptor keys, and checks the
// Service the examples name.
func chartRules(t *testing.T) map[string][]string {
	t.Helper()
	var o objects
	if err := decodeAll("helm", []byte(render(t, `envoy: {enabled: true}`)), &o); err != nil {
		t.Fatal(err)
	}
	svc := o.services[0]
	if host := svc.Name + ".sluice.svc.cluster.local"; host != sluiceHost {
		t.Errorf("the chart's Service for release rl is %s, the examples name %s", host, sluiceHost)
	}
	var port int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "grpc-rls" {
			port = p.Port
		}
	}
	if port != rlsPort {
		t.Errorf("the chart's grpc-rls port is %d, the examples use %d", port, rlsPort)
	}
	domains := map[string][]string{}
	for _, body := range o.configMaps["rl-sluice-ratelimit"].Data {
		var f struct {
			Domain      string `json:"domain"`
			Descriptors []struct {
				Key string `json:"key"`
			} `json:"descriptors"`
		}
		if err := yaml.Unmarshal([]byte(body), &f); err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Descriptors {
			domains[f.Domain] = append(domains[f.Domain], d.Key)
		}
	}
	return domains
}

// TestIstioExample decodes deploy/istio/ratelimit.yaml: each EnvoyFilter
// strictly into Istio's client-go type (apiVersion, kind, metadata) and its
// spec strictly into Istio's API proto (protojson: an unknown field is an
// error), then each patch's value into the Envoy message it patches, with
// Envoy's validation; and checks that the filter asks sluice's Service for
// a domain and descriptors the chart's rules have.
func TestIstioExample(t *testing.T) {
	domains := chartRules(t)
	var filter *hcmv3.HttpFilter
	var rls []*routev3.RateLimit
	for i, doc := range splitYAML(t, "../istio/ratelimit.yaml") {
		var ef istioclient.EnvoyFilter
		if err := yaml.UnmarshalStrict(doc, &ef); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if ef.APIVersion != "networking.istio.io/v1alpha3" || ef.Kind != "EnvoyFilter" {
			t.Fatalf("document %d: %s %s", i, ef.APIVersion, ef.Kind)
		}
		var raw struct {
			Spec json.RawMessage `json:"spec"`
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(js, &raw); err != nil {
			t.Fatal(err)
		}
		var spec istioapi.EnvoyFilter
		if err := protojson.Unmarshal(raw.Spec, &spec); err != nil {
			t.Fatalf("%s: spec: %v", ef.Name, err)
		}
		for _, p := range spec.GetConfigPatches() {
			value, err := protojson.Marshal(p.GetPatch().GetValue())
			if err != nil {
				t.Fatal(err)
			}
			switch p.GetApplyTo() {
			case istioapi.EnvoyFilter_HTTP_FILTER:
				filter = &hcmv3.HttpFilter{}
				if err := envoyJSON(value, filter); err != nil {
					t.Errorf("%s: HTTP_FILTER: %v", ef.Name, err)
				}
				if sub := p.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName(); p.GetPatch().GetOperation() != istioapi.EnvoyFilter_Patch_INSERT_BEFORE || sub != "envoy.filters.http.router" {
					t.Errorf("%s: the filter goes %v %q, want INSERT_BEFORE the router", ef.Name, p.GetPatch().GetOperation(), sub)
				}
			case istioapi.EnvoyFilter_VIRTUAL_HOST:
				var vh routev3.VirtualHost // a partial one, merged: not validated whole
				if err := protojson.Unmarshal(value, &vh); err != nil {
					t.Errorf("%s: VIRTUAL_HOST: %v", ef.Name, err)
				}
				for _, r := range vh.GetRateLimits() {
					if err := r.ValidateAll(); err != nil {
						t.Errorf("%s: rate_limits: %v", ef.Name, err)
					}
				}
				rls = append(rls, vh.GetRateLimits()...)
			default:
				t.Errorf("%s: unchecked patch %v", ef.Name, p.GetApplyTo())
			}
		}
	}
	if filter == nil {
		t.Fatal("no HTTP_FILTER patch")
	}
	checkRateLimitFilter(t, filter, fmt.Sprintf("outbound|%d||%s", rlsPort, sluiceHost), domains)
	var rl ratelimitv3.RateLimit
	_ = filter.GetTypedConfig().UnmarshalTo(&rl)
	checkActions(t, rls, domains[rl.GetDomain()])
}

// TestEnvoyGatewayExample decodes deploy/envoy-gateway: the EnvoyGateway
// config strictly into Envoy Gateway's type and through its own
// validation, the EnvoyPatchPolicy strictly into its type, and each patch's
// value into the Envoy message it adds, with Envoy's validation; and checks
// that the filter asks the added cluster, which reaches sluice's Service,
// for a domain and descriptors the chart's rules have.
func TestEnvoyGatewayExample(t *testing.T) {
	domains := chartRules(t)

	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(splitYAML(t, "../envoy-gateway/envoy-gateway-config.yaml")[0], &cm); err != nil {
		t.Fatal(err)
	}
	var eg egv1a1.EnvoyGateway
	if err := yaml.UnmarshalStrict([]byte(cm.Data["envoy-gateway.yaml"]), &eg); err != nil {
		t.Fatalf("envoy-gateway.yaml: %v", err)
	}
	if err := egvalidation.ValidateEnvoyGateway(&eg); err != nil {
		t.Errorf("envoy-gateway.yaml: %v", err)
	}
	if eg.ExtensionAPIs == nil || !eg.ExtensionAPIs.EnableEnvoyPatchPolicy {
		t.Error("EnvoyPatchPolicy is not enabled")
	}
	if eg.RateLimit != nil {
		t.Error("rateLimit: set: Envoy Gateway would run its own envoyproxy/ratelimit beside sluice")
	}

	docs := splitYAML(t, "../envoy-gateway/ratelimit.yaml")
	if len(docs) != 1 {
		t.Fatalf("%d documents, want 1", len(docs))
	}
	var epp egv1a1.EnvoyPatchPolicy
	if err := yaml.UnmarshalStrict(docs[0], &epp); err != nil {
		t.Fatal(err)
	}
	if epp.Spec.Type != egv1a1.JSONPatchEnvoyPatchType {
		t.Errorf("type %q", epp.Spec.Type)
	}
	var filter *hcmv3.HttpFilter
	var rls []*routev3.RateLimit
	clusters := map[string]*clusterv3.Cluster{}
	for _, p := range epp.Spec.JSONPatches {
		if p.Operation.Op != "add" || p.Operation.Value == nil || p.Operation.Path == nil {
			t.Fatalf("patch %s %s: op %q, want add with a path and a value", p.Type, p.Name, p.Operation.Op)
		}
		value, path := p.Operation.Value.Raw, *p.Operation.Path
		switch p.Type {
		case egv1a1.ListenerEnvoyResourceType:
			if path != "/default_filter_chain/filters/0/typed_config/http_filters/0" {
				t.Errorf("listener patch at %s, want the first HTTP filter of the default chain", path)
			}
			filter = &hcmv3.HttpFilter{}
			if err := envoyJSON(value, filter); err != nil {
				t.Errorf("listener patch: %v", err)
			}
		case egv1a1.RouteConfigurationEnvoyResourceType:
			if path != "/virtual_hosts/0/rate_limits" {
				t.Errorf("route patch at %s, want /virtual_hosts/0/rate_limits", path)
			}
			var list []json.RawMessage
			if err := json.Unmarshal(value, &list); err != nil {
				t.Fatalf("route patch: %v", err)
			}
			for _, item := range list {
				r := &routev3.RateLimit{}
				if err := envoyJSON(item, r); err != nil {
					t.Errorf("route patch: %v", err)
				}
				rls = append(rls, r)
			}
		case egv1a1.ClusterEnvoyResourceType:
			c := &clusterv3.Cluster{}
			if err := envoyJSON(value, c); err != nil {
				t.Errorf("cluster patch: %v", err)
			}
			if c.GetName() != p.Name {
				t.Errorf("cluster patch named %s adds cluster %s", p.Name, c.GetName())
			}
			clusters[c.GetName()] = c
		default:
			t.Errorf("unchecked patch type %s", p.Type)
		}
	}
	if filter == nil {
		t.Fatal("no listener patch adds the rate limit filter")
	}
	checkRateLimitFilter(t, filter, "sluice_rls", domains)
	var rl ratelimitv3.RateLimit
	_ = filter.GetTypedConfig().UnmarshalTo(&rl)
	checkActions(t, rls, domains[rl.GetDomain()])
	c, ok := clusters["sluice_rls"]
	if !ok {
		t.Fatal("no cluster sluice_rls is added")
	}
	if _, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; !ok {
		t.Error("the sluice_rls cluster does not speak HTTP/2 (gRPC)")
	}
	for _, e := range c.GetLoadAssignment().GetEndpoints() {
		for _, le := range e.GetLbEndpoints() {
			sa := le.GetEndpoint().GetAddress().GetSocketAddress()
			if sa.GetAddress() != sluiceHost || sa.GetPortValue() != rlsPort {
				t.Errorf("sluice_rls reaches %s:%d, want %s:%d", sa.GetAddress(), sa.GetPortValue(), sluiceHost, rlsPort)
			}
		}
	}
}

// TestShadowFilterExample decodes deploy/envoy/shadow-filter.yaml against
// Envoy's HttpFilter and RateLimit filter types (strictly, validated) and
// checks that it never enforces and asks the sluice_rls cluster of
// deploy/envoy/envoy.yaml.
func TestShadowFilterExample(t *testing.T) {
	data, err := os.ReadFile("../envoy/shadow-filter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	var f hcmv3.HttpFilter
	if err := envoyJSON(js, &f); err != nil {
		t.Fatal(err)
	}
	var rl ratelimitv3.RateLimit
	if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	if err := rl.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	if e := rl.GetFilterEnforced(); e == nil || e.GetDefaultValue().GetNumerator() != 0 {
		t.Errorf("filter_enforced %v: the shadow filter must enforce nothing", e)
	}
	if e := rl.GetFilterEnabled(); e != nil && e.GetDefaultValue().GetNumerator() == 0 {
		t.Error("filter_enabled 0: the shadow filter would never ask sluice")
	}
	if rl.GetFailureModeDeny() {
		t.Error("failure_mode_deny: a shadow must never turn a sluice outage into errors")
	}
	boot, err := os.ReadFile("../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cluster := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	if !strings.Contains(string(boot), "- name: "+cluster+"\n") {
		t.Errorf("cluster %s is not defined in deploy/envoy/envoy.yaml", cluster)
	}
}
