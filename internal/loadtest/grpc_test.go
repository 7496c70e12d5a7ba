package loadtest

import (
	"context"
	"log/slog"
	"math"
	"net"
	"os"
	"testing"
	"time"

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
