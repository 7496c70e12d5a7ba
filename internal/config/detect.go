package config

import (
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/sluice-io/sluice/internal/gateway"
)

// Kind is the kind of a configuration file sluice reads.
type Kind int

// The kinds of configuration files.
const (
	// KindUnknown is a document Detect cannot place, such as one that is
	// not YAML; loading it as KindServe reports why.
	KindUnknown Kind = iota
	// KindServe is the file of `sluice serve`, read by Load.
	KindServe
	// KindGateway is the file of `sluice gateway`, read by gateway.Load.
	KindGateway
	// KindEnvoy is one envoyproxy/ratelimit file (domain: and descriptors:),
	// read by the Envoy rate limit service from its config_dir.
	KindEnvoy
)

// String names the kind as `sluice config check` prints it.
func (k Kind) String() string {
	switch k {
	case KindServe:
		return "sluice serve config"
	case KindGateway:
		return "sluice gateway config"
	case KindEnvoy:
		return "envoyproxy/ratelimit config"
	}
	return "unknown config"
}

// Detect tells which kind of file data is from its top-level fields: those
// only one kind has decide (policies or authz for serve; upstream, models
// or lease_ttl for the gateway; domain for Envoy), then the shape of its
// tiers (a list of policies for serve, rpm/tpm limits for the gateway). A
// file with only shared fields is a serve config.
func Detect(data []byte) Kind {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil || len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return KindUnknown
	}
	top := root.Content[0]
	serve, gw := yamlFields(reflect.TypeFor[File]()), yamlFields(reflect.TypeFor[gateway.Config]())
	var serveOnly, gwOnly, envoy int
	var tiers *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		k := top.Content[i].Value
		switch {
		case k == "domain" || k == "descriptors":
			envoy++
		case serve[k] && !gw[k]:
			serveOnly++
		case gw[k] && !serve[k]:
			gwOnly++
		}
		if k == "tiers" {
			tiers = top.Content[i+1]
		}
	}
	switch {
	case envoy > 0 && serveOnly == 0 && gwOnly == 0:
		return KindEnvoy
	case gwOnly > serveOnly:
		return KindGateway
	case serveOnly > gwOnly:
		return KindServe
	}
	if tiers != nil && tiers.Kind == yaml.MappingNode {
		tierFields := yamlFields(reflect.TypeFor[gateway.TierConfig]())
		for i := 1; i < len(tiers.Content); i += 2 {
			t := tiers.Content[i]
			for j := 0; t.Kind == yaml.MappingNode && j+1 < len(t.Content); j += 2 {
				switch k := t.Content[j].Value; {
				case k == "policies":
					return KindServe
				case tierFields[k] || strings.HasPrefix(k, "rp") || strings.HasPrefix(k, "tp"):
					return KindGateway
				}
			}
		}
	}
	return KindServe
}

// yamlFields is the set of YAML field names of a struct type.
func yamlFields(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if tag != "" && tag != "-" {
			out[tag] = true
		}
	}
	return out
}

// Recognised reports whether data is a YAML mapping with at least one
// top-level field of a kind sluice reads (serve, gateway or
// envoyproxy/ratelimit). `sluice config check DIR` skips the files that are
// not, such as an Envoy bootstrap or a Compose file beside sluice's.
func Recognised(data []byte) bool {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil || len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return false
	}
	top := root.Content[0]
	serve, gw := yamlFields(reflect.TypeFor[File]()), yamlFields(reflect.TypeFor[gateway.Config]())
	for i := 0; i+1 < len(top.Content); i += 2 {
		k := top.Content[i].Value
		if k == "domain" || k == "descriptors" || serve[k] || gw[k] {
			return true
		}
	}
	return false
}
