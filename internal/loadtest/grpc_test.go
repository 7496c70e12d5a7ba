package loadtest

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	protov2 "google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/internal/envoyrls"
	"github.com/sluice-io/sluice/memstore"
)

func TestRunGRPC(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	svc, err := envoyrls.New(envoyrls.Options{Store: store, ConfigDir: "../envoyrls/testdata/config", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-done })

	// key3 is 1/hour: of 300 calls on one value, one passes.
	res, err := RunGRPC(context.Background(), GRPCOptions{
		Addr: lis.Addr().String(), Domain: "test-domain", Descriptors: []string{"key3=v{key}"},
		Keys: 1, Streams: 8, Requests: 300, PID: os.Getpid(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 300 || res.Errors != 0 || res.Codes["OK"] != 1 || res.Codes["OVER_LIMIT"] != 299 {
		t.Fatalf("result %+v codes %v", res.Result, res.Codes)
	}
	if res.Hist.Count() != 300 || res.ServerCPU < 0 {
		t.Errorf("histogram %d, cpu %s", res.Hist.Count(), res.ServerCPU)
	}
	if _, err := RunGRPC(context.Background(), GRPCOptions{Addr: lis.Addr().String(), Domain: "d", Descriptors: []string{"novalue"}, Requests: 1}); err == nil {
		t.Error("descriptor without '=' accepted")
	}
	// Paced: the 40th request leaves 40/Rate after the start, whatever the
	// streams could do (pacing only delays, so the bound is one-sided).
	res, err = RunGRPC(context.Background(), GRPCOptions{
		Addr: lis.Addr().String(), Domain: "test-domain", Descriptors: []string{"key3=v{key}"},
		Keys: 1, Streams: 8, Requests: 40, Rate: 1000,
	})
	if err != nil || res.Requests != 40 || res.Elapsed < 40*time.Millisecond {
		t.Fatalf("paced at 1000/s: %+v %v, want 40 requests in at least 40ms", res, err)
	}
	for _, r := range []float64{-1, math.NaN()} {
		if _, err := RunGRPC(context.Background(), GRPCOptions{Addr: lis.Addr().String(), Domain: "d", Descriptors: []string{"k=v"}, Requests: 1, Rate: r}); err == nil {
			t.Errorf("rate %v accepted", r)
		}
	}
}

func TestProcCPU(t *testing.T) {
	if d, err := procCPU(os.Getpid()); err != nil || d < 0 {
		t.Fatalf("procCPU: %s, %v", d, err)
	}
	if _, err := procCPU(1 << 30); err == nil {
		t.Error("no error for a missing process")
	}
}

// TestAppendRequest: the load's hand-written requests are the bytes
// proto.Marshal writes for the same RateLimitRequest, and its response
// reader finds the overall code of a marshalled RateLimitResponse.
func TestAppendRequest(t *testing.T) {
	long := strings.Repeat("v", 200) // a length over one varint byte
	for _, c := range []struct {
		tmpl []descTemplate
		k    int
	}{
		{[]descTemplate{{key: "remote_address", prefix: "10.0.", keyed: true}}, 12345},
		{[]descTemplate{{key: "a", prefix: "x", suffix: "y", keyed: true}, {key: "b", prefix: "fixed"}}, 0},
		{[]descTemplate{{key: long, prefix: long, suffix: long, keyed: true}}, 99999999},
	} {
		want := &rlsv3.RateLimitRequest{Domain: "edge"}
		for _, e := range c.tmpl {
			v := e.prefix
			if e.keyed {
				v += strconv.Itoa(c.k) + e.suffix
			}
			want.Descriptors = append(want.Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: e.key, Value: v}}})
		}
		wb, err := protov2.MarshalOptions{Deterministic: true}.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got := appendRequest(nil, "edge", c.tmpl, c.k)
		if !bytes.Equal(got, wb) {
			t.Errorf("appendRequest(%v, %d) = %x, want %x", c.tmpl, c.k, got, wb)
		}
	}
	codec := wireCodec{base: encoding.GetCodecV2(grpcproto.Name)}
	for _, code := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_UNKNOWN} {
		resp := &rlsv3.RateLimitResponse{OverallCode: code, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: code, LimitRemaining: 7, DurationUntilReset: durationpb.New(time.Second)}}}
		b, err := protov2.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var r wireResponse
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b[:3]), mem.SliceBuffer(b[3:])}, &r); err != nil || r.code != code {
			t.Errorf("code %v: read %v, %v", code, r.code, err)
		}
	}
	var r wireResponse
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x08})}, &r); err == nil {
		t.Error("a truncated response was read")
	}
}
