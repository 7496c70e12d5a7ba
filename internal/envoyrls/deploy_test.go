package envoyrls

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"
)

// TestDeployExample checks deploy/envoy: Envoy's own Bootstrap proto accepts
// envoy.yaml, its rate-limit filter points at port 8081 with the domain of
// ratelimit/, and every descriptor key its route sends has a rule there.
func TestDeployExample(t *testing.T) {
	data, err := os.ReadFile("../../deploy/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("envoy.yaml is not a valid bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := bs.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var rl ratelimitfilterv3.RateLimit
	found := false
	for _, f := range hcm.GetHttpFilters() {
		if f.GetName() == "envoy.filters.http.ratelimit" {
			if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil {
				t.Fatal(err)
			}
			found = true
		}
	}
	if !found || rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName() != "sluice_rls" {
		t.Fatalf("no ratelimit filter using cluster sluice_rls: %v", &rl)
	}
	files, err := readDir("../../deploy/envoy/ratelimit")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := parseConfig(files, false, testMetrics(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	dom := cfg.domains[rl.GetDomain()]
	if dom == nil {
		t.Fatalf("domain %q is not in deploy/envoy/ratelimit", rl.GetDomain())
	}
	route := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0]
	for _, r := range route.GetRoute().GetRateLimits() {
		for _, a := range r.GetActions() {
			key := "remote_address"
			if h := a.GetRequestHeaders(); h != nil {
				key = h.GetDescriptorKey()
			}
			if !hasRuleFor(&dom.root, key) {
				t.Errorf("descriptor key %q has no rule in deploy/envoy/ratelimit", key)
			}
		}
	}
	port := bs.GetStaticResources().GetClusters()[0].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
	if port != 8081 {
		t.Errorf("sluice_rls port %d, want 8081", port)
	}
}

// hasRuleFor reports whether a top-level descriptor of key, with or
// without a value, is configured.
func hasRuleFor(n *node, key string) bool {
	for k := range n.children {
		if k == key || strings.HasPrefix(k, key+"_") {
			return true
		}
	}
	return false
}
