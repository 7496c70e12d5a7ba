package loadtest

import (
	"fmt"
	"strconv"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// The load generator's own cost
//
// The load generator shares the machine with the server it loads (two
// cores in the benchmarks), so every microsecond it spends on a call is
// taken from the server, and from every server alike: a fixed cost per
// request that pulls every ratio of two servers' request rates toward 1.
// So RunGRPC writes each RateLimitRequest's wire bytes itself (the bytes
// proto.Marshal writes for envoy/service/ratelimit/v3/rls.proto's message;
// TestAppendRequest checks them) and reads only the response's
// overall_code, instead of building
// and marshalling a message and decoding the whole answer per call. The
// calls are otherwise grpc-go's own: the same HTTP/2 framing, headers and
// grpc-timeout, through the same connections.

// wireRequest is one call's RateLimitRequest, already in wire format.
type wireRequest struct{ b []byte }

// wireResponse is what is read of a RateLimitResponse.
type wireResponse struct{ code rlsv3.RateLimitResponse_Code }

// wireCodec passes wireRequest through and decodes wireResponse; any
// other message goes to the proto codec.
type wireCodec struct{ base protoCodec }

// protoCodec is grpc's proto codec (encoding.CodecV2).
type protoCodec interface {
	Marshal(v any) (mem.BufferSlice, error)
	Unmarshal(data mem.BufferSlice, v any) error
}

func (c wireCodec) Name() string { return proto.Name }

func (c wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*wireRequest); ok {
		// Its own slice each call: grpc may hold a message's buffer until
		// its frame is written, which a server that answers before it has
		// read the request makes later than the call's end.
		return mem.BufferSlice{mem.SliceBuffer(r.b)}, nil
	}
	return c.base.Marshal(v)
}

func (c wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*wireResponse)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	var arr [256]byte
	b := arr[:0]
	for _, buf := range data {
		b = append(b, buf.ReadOnlyData()...)
	}
	r.code = rlsv3.RateLimitResponse_UNKNOWN
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("loadtest: response: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return fmt.Errorf("loadtest: response: %w", protowire.ParseError(n))
			}
			r.code = rlsv3.RateLimitResponse_Code(x) // the last one wins, as in proto
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return fmt.Errorf("loadtest: response: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return nil
}

// descTemplate is a descriptor of the load: one entry, key=prefix{key}suffix,
// or key=prefix when keyed is false.
type descTemplate struct {
	key, prefix, suffix string
	keyed               bool
}

// appendRequest appends the wire format of RateLimitRequest{Domain:
// domain, Descriptors: one per template, with {key} = k} to b. Field
// numbers from rls.proto (RateLimitRequest: domain 1, descriptors 2) and
// ratelimit.proto (RateLimitDescriptor: entries 1; Entry: key 1, value 2).
func appendRequest(b []byte, domain string, tmpl []descTemplate, k int) []byte {
	var digits [20]byte
	kd := strconv.AppendInt(digits[:0], int64(k), 10)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, domain)
	for _, e := range tmpl {
		vlen := len(e.prefix)
		if e.keyed {
			vlen += len(kd) + len(e.suffix)
		}
		entry := 1 + protowire.SizeBytes(len(e.key)) + 1 + protowire.SizeBytes(vlen)
		desc := 1 + protowire.SizeBytes(entry)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(desc))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(entry))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, e.key)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(vlen))
		b = append(b, e.prefix...)
		if e.keyed {
			b = append(b, kd...)
			b = append(b, e.suffix...)
		}
	}
	return b
}
