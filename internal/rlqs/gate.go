package rlqs

import (
	"fmt"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Reports weighed before they are decoded
//
// A report decoded takes several times its wire bytes (a map and two
// strings per bucket id entry), and every stream may have one being
// read. So a report takes its wire bytes from the server's pending
// budget (MaxPendingBytes) before it is decoded, and holds them until it
// is answered: a report beyond the budget is dropped undecoded (its
// usages counted from the wire), and a report larger than any the
// stream's caps allow (max_usages_per_report usages of the largest bucket
// ids, maxUsageWireBytes each) ends the stream undecoded. What is decoded
// or held at one instant, server-wide, is then at most MaxPendingBytes of
// reports, whatever the number of streams (the report being read on each
// stream is not: docs/envoy.md gives that term). gRPC calls UnmarshalBuffers
// through the gRPC server's codec (envoyrls.BufferUnmarshaler); on a
// server with the plain proto codec, reports are decoded as before and
// weighed after.

// maxUsageWireBytes bounds one bucket usage on the wire: a bucket id of
// MaxBucketIDBytes in MaxBucketIDEntries entries (each with its map
// entry's, key's and value's tags and lengths), the time elapsed and the
// two counts, with their tags and lengths.
const maxUsageWireBytes = MaxBucketIDBytes + MaxBucketIDEntries*12 + 64

// maxReportBytes is the largest report a stream takes: maxUsage usages
// and a domain name.
func maxReportBytes(maxUsage int) int { return maxUsage*maxUsageWireBytes + 4096 }

// gatedReport is the message a stream receives: a report, decoded only
// once its bytes are taken from the pending budget.
type gatedReport struct {
	s     *Server
	limit int // maxReportBytes of the stream's config
	msg   rlqsv3.RateLimitQuotaUsageReports
	// size is what the report took from the pending budget (0 when it
	// was decoded by another codec and weighed after).
	size int64
	// refused ends the stream: a report over limit, undecoded.
	refused error
	// dropped is the number of usages of a report dropped undecoded,
	// beyond the budget; 0 when it was decoded.
	dropped int
}

// ProtoReflect makes a gatedReport a proto.Message, the report it holds:
// a gRPC server with the plain proto codec (not sluice's) decodes into it
// directly, and the report is weighed after.
func (g *gatedReport) ProtoReflect() protoreflect.Message { return g.msg.ProtoReflect() }

// UnmarshalBuffers implements envoyrls.BufferUnmarshaler.
func (g *gatedReport) UnmarshalBuffers(data mem.BufferSlice) error {
	n := data.Len()
	if n > g.limit {
		// Ended by the handler with this status: gRPC would turn an
		// error from here into INTERNAL.
		g.refused = status.Errorf(codes.ResourceExhausted, "rlqs: a report of %d bytes; at most %d", n, g.limit)
		return nil
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if !g.s.pending.take(int64(n)) {
		g.dropped = max(1, countUsages(b))
		return nil
	}
	if err := proto.Unmarshal(b, &g.msg); err != nil {
		g.s.pending.give(int64(n))
		return fmt.Errorf("rlqs: decode a report: %w", err)
	}
	g.size = int64(n)
	return nil
}

// countUsages counts the bucket usages (field 2) of an encoded report
// without decoding them.
func countUsages(b []byte) int {
	n := 0
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return n
		}
		b = b[l:]
		l = protowire.ConsumeFieldValue(num, typ, b)
		if l < 0 {
			return n
		}
		b = b[l:]
		if num == 2 {
			n++
		}
	}
	return n
}
