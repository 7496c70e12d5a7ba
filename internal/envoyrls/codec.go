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

// BufferUnmarshaler is a message that decodes itself from the buffers
// gRPC read, so that it can weigh its size before decoding it: the quota
// service's reports (internal/rlqs) take their bytes from a server-wide
// budget first, and one beyond it is dropped undecoded.
type BufferUnmarshaler interface {
	UnmarshalBuffers(data mem.BufferSlice) error
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if u, ok := v.(BufferUnmarshaler); ok {
		return u.UnmarshalBuffers(data)
	}
	if g, ok := v.(*gatedRequest); ok {
		// The message is read, not yet decoded: its size and cost first
		// (fairness.go).
		if decode, err := g.admit(data.Len()); !decode {
			return err
		}
		v = &g.req
	}
	req, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	// As the proto codec does: one contiguous copy from the pool, which
	// neither decoder retains.
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if len(b) > smallMessage {
		if n, beyond := bounds(b); beyond {
			// More descriptors or entries than the service takes: decoded
			// by hand, within the bounds.
			protov2.Reset(req)
			req.Descriptors = make([]*ratelimitv3.RateLimitDescriptor, 0, n)
			return unmarshalRequest(b, req)
		}
	}
	err := protov2.Unmarshal(b, req)
	if err == nil {
		return nil
	}
	protov2.Reset(req)
	if lerr := unmarshalRequest(b, req); lerr != nil {
		return errors.Join(err, lerr)
	}
	return nil
}

// Bounded decoding
//
// A descriptor or an entry takes two bytes on the wire and some hundred
// bytes decoded, so gRPC's 4 MiB bound on a message let one request hold
// two million descriptors (or entries), a quarter of a gigabyte decoded,
// before the service could answer it OVER_LIMIT (maxDescriptors,
// maxEntries). A message that holds more than those is decoded by hand:
// the descriptors past maxDescriptors+1 are one shared empty descriptor
// (the count, and so the number of statuses, stays the request's), and a
// descriptor keeps maxEntries+1 entries; the service answers it
// OVER_LIMIT all the same.

// smallMessage is the size under which a message cannot hold more than
// maxDescriptors descriptors, nor a descriptor more than maxEntries
// entries (each takes two bytes at least).
const smallMessage = 2 * (maxEntries + 1)

// bounds counts the descriptors of the RateLimitRequest in b and reports
// whether it holds more than maxDescriptors of them, or a descriptor more
// than maxEntries entries. Malformed wire format is left to the decoders
// to report.
func bounds(b []byte) (descs int, beyond bool) {
	_ = fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 2 || typ != protowire.BytesType {
			return nil
		}
		if descs++; descs > maxDescriptors || beyond {
			beyond = true
			return nil
		}
		entries := 0
		_ = fields(v, func(num protowire.Number, typ protowire.Type, _ []byte, _ uint64) error {
			if num == 1 && typ == protowire.BytesType {
				if entries++; entries > maxEntries {
					beyond = true
					return errBeyond
				}
			}
			return nil
		})
		return nil
	})
	return descs, beyond
}

// errBeyond stops the count of a descriptor's entries.
var errBeyond = errors.New("envoyrls: beyond the bounds")

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
// strings are UTF-8, and within the bounds (see Bounded decoding).
// Unknown fields are skipped.
func unmarshalRequest(b []byte, req *rlsv3.RateLimitRequest) error {
	var past *ratelimitv3.RateLimitDescriptor // the descriptors past the bound
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			req.Domain = string(v)
		case num == 2 && typ == protowire.BytesType && len(req.Descriptors) > maxDescriptors:
			if past == nil {
				past = &ratelimitv3.RateLimitDescriptor{}
			}
			req.Descriptors = append(req.Descriptors, past)
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
		case num == 1 && typ == protowire.BytesType && len(d.Entries) > maxEntries:
			// Past the bound: the descriptor is over it already.
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
