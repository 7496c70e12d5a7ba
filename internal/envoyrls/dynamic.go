package envoyrls

import (
	"fmt"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata is a response's dynamic_metadata as envoyproxy/ratelimit
// builds it (src/service/ratelimit.go, ratelimitToMetadata): "domain";
// "descriptors", each {"entries": ["key=value", ...], "limit": the
// request's override as text, "hitsAddend"}; the request's "hitsAddend"
// when set; and "metadata", the metadata: of the rules of the descriptors
// that passed (not over the limit; unlimited ones are left out as
// envoyproxy/ratelimit leaves them out of its passed list), merged in
// request order: a key already present is kept, and two structs under one
// key are merged the same way (mergeMetadata).
func dynamicMetadata(req *rlsv3.RateLimitRequest, items []item) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		if d == nil {
			continue
		}
		descs = append(descs, structpb.NewStructValue(descriptorStruct(d)))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range items {
		it := &items[i]
		if it.rule == nil || it.rule.metadata == nil || it.kind == kindNone || it.kind == kindUnlimited {
			continue
		}
		if it.decided && !it.decision.Allowed && !it.shadow {
			continue
		}
		mergeMetadata(passed, it.rule.metadata)
	}
	if len(passed.GetFields()) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

// descriptorStruct is one request descriptor in the dynamic metadata.
func descriptorStruct(d *ratelimitv3.RateLimitDescriptor) *structpb.Struct {
	entries := make([]*structpb.Value, 0, len(d.GetEntries()))
	for _, e := range d.GetEntries() {
		entries = append(entries, structpb.NewStringValue(fmt.Sprintf("%s=%s", e.GetKey(), e.GetValue())))
	}
	fields := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
	if l := d.GetLimit(); l != nil {
		fields["limit"] = structpb.NewStringValue(l.String())
	}
	if h := d.GetHitsAddend(); h != nil {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata adds src's fields to dest: a field dest lacks is added
// (shared, not copied: both are read-only once built), two structs under
// one name are merged, and any other field dest has already is kept.
func mergeMetadata(dest, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dest.Fields[k]
		if !ok {
			dest.Fields[k] = v
			continue
		}
		ds, ss := have.GetStructValue(), v.GetStructValue()
		if ds != nil && ss != nil {
			// Copy before merging into it: have may be a rule's own value.
			cp := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(ds.Fields))}
			for kk, vv := range ds.Fields {
				cp.Fields[kk] = vv
			}
			mergeMetadata(cp, ss)
			dest.Fields[k] = structpb.NewStructValue(cp)
		}
	}
}
