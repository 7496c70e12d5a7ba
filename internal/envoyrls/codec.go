package envoyrls

import (
	"errors"
	"fmt"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	protov2 "google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Invalid UTF-8
//
// Descriptor values are often a client's bytes: a header, a path. HTTP
// header values may hold any octet, and Envoy's C++ protobuf sends a proto3
// string field as it is, while Go's protobuf refuses to decode one that is
// not UTF-8: the call would fail with codes.Internal, which an Envoy with
// failure_mode_deny: false lets through, limits and all. So the service
// decodes a RateLimitRequest that the standard decoder refuses once more,
// by hand, keeping every string's bytes as they are: each distinct value
// keeps its own counter (key.go), and nothing is refused for its bytes.

// codec is the gRPC codec of the service's server: the standard proto codec,
// with the lenient second try for RateLimitRequest.
type codec struct{ base encoding.CodecV2 }

func newCodec() codec { return codec{base: encoding.GetCodecV2(proto.Name)} }

func (c codec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c codec) Name() string { return proto.Name }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	req, ok := v.(*rlsv3.RateLimitRequest)
	if err == nil || !ok {
		return err
	}
	protov2.Reset(req)
	if lerr := unmarshalRequest(data.Materialize(), req); lerr != nil {
		return errors.Join(err, lerr)
	}
	return nil
}

// errWire means a message is not valid protobuf wire format.
var errWire = errors.New("envoyrls: malformed protobuf")

// fields calls f for each field of the message in b.
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %w", errWire, protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: %w", errWire, protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// unmarshalRequest decodes a RateLimitRequest without checking that its
// strings are UTF-8. Unknown fields are skipped.
func unmarshalRequest(b []byte, req *rlsv3.RateLimitRequest) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			req.Domain = string(v)
		case num == 2 && typ == protowire.BytesType:
			d := &ratelimitv3.RateLimitDescriptor{}
			if err := unmarshalDescriptor(v, d); err != nil {
				return err
			}
			req.Descriptors = append(req.Descriptors, d)
		case num == 3 && typ == protowire.VarintType:
			req.HitsAddend = uint32(x)
		}
		return nil
	})
}

func unmarshalDescriptor(b []byte, d *ratelimitv3.RateLimitDescriptor) error {
	merge := protov2.UnmarshalOptions{Merge: true}
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			e := &ratelimitv3.RateLimitDescriptor_Entry{}
			err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					e.Key = string(v)
				case num == 2 && typ == protowire.BytesType:
					e.Value = string(v)
				}
				return nil
			})
			if err != nil {
				return err
			}
			d.Entries = append(d.Entries, e)
		case num == 2 && typ == protowire.BytesType:
			// No strings inside: the standard decoder does.
			if d.Limit == nil {
				d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{}
			}
			return merge.Unmarshal(v, d.Limit)
		case num == 3 && typ == protowire.BytesType:
			if d.HitsAddend == nil {
				d.HitsAddend = &wrapperspb.UInt64Value{}
			}
			return merge.Unmarshal(v, d.HitsAddend)
		case num == 4 && typ == protowire.VarintType:
			d.IsNegativeHits = x != 0
		}
		return nil
	})
}
