package envoyrls

// The processes of the fairness tests (fairness_test.go). The test binary
// runs itself again as each of them, chosen by the environment: the server
// (a Runner on the memory store, as sluice serve builds it), a descriptor
// flood and a rapid-reset flood. Each is a process of its own so that the
// well-behaved client's latency, measured in the test's process, competes
// with the flood only for the machine, as it would in production, and so
// that the server's memory is its own.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	rtmetrics "runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	protov2 "google.golang.org/protobuf/proto"

	"github.com/sluice-io/sluice/memstore"
)

// Environment of a child process.
const (
	childEnv     = "SLUICE_ENVOYRLS_CHILD" // server, flood or reset
	childAddrEnv = "SLUICE_ENVOYRLS_ADDR"  // the server's gRPC address
	childSrcEnv  = "SLUICE_ENVOYRLS_SRC"   // the flood's source IP
)

// fairConfig is the server's rate-limit configuration: a limit no test
// reaches for the well-behaved client, and one for the flood's
// descriptors, so that its requests are looked up and charged.
const fairConfig = `domain: fair
descriptors:
  - key: good
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000000}
`

// childMain runs the process the environment names and reports whether
// it did; TestMain exits then.
func childMain() (int, bool) {
	var err error
	switch os.Getenv(childEnv) {
	case "":
		return 0, false
	case "server":
		err = childServer()
	case "flood":
		err = childFlood()
	case "reset":
		err = childReset()
	default:
		err = fmt.Errorf("unknown child %q", os.Getenv(childEnv))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1, true
	}
	return 0, true
}

// childServer serves the fair domain on 127.0.0.1 with the default limits
// and prints "grpc ADDR". A line "cpu" on its stdin prints "cpu N", the
// CPU time it has used in nanoseconds. A line "mem" on its stdin prints "mem N", the
// most memory the Go runtime has held from the OS (the heap, stacks and
// its own) at any 2 ms sample: the process's RSS without the race
// detector's shadow memory. It stops when its stdin closes.
func childServer() error {
	dir, err := os.MkdirTemp("", "sluice-fair")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "fair.yaml"), []byte(fairConfig), 0o644); err != nil {
		return err
	}
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := New(Options{Store: store, ConfigDir: dir, Logger: log})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var peak atomic.Uint64
	go samplePeak(ctx, &peak)
	var out sync.Mutex
	r := &Runner{Service: svc, GRPCAddr: "127.0.0.1:0", OnListen: func(_ string, a net.Addr) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf("grpc %s\n", a)
	}}
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			out.Lock()
			switch sc.Text() {
			case "mem":
				fmt.Printf("mem %d\n", peak.Load())
			case "cpu":
				var ru syscall.Rusage
				_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
				fmt.Printf("cpu %d\n", ru.Utime.Nano()+ru.Stime.Nano())
			}
			out.Unlock()
		}
		cancel()
	}()
	return r.Run(ctx)
}

// samplePeak keeps the most memory the runtime held from the OS.
func samplePeak(ctx context.Context, peak *atomic.Uint64) {
	s := []rtmetrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		rtmetrics.Read(s)
		if held := s[0].Value.Uint64() - s[1].Value.Uint64(); held > peak.Load() {
			peak.Store(held)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// floodRequest is a request at the service's bounds (maxDescriptors
// descriptors of maxEntries entries), its values as long as keeps it
// within size bytes.
func floodRequest(size int) rawMsg {
	build := func(vlen int) []byte {
		v := bytes.Repeat([]byte{'v'}, vlen)
		req := &rlsv3.RateLimitRequest{Domain: "fair"}
		for d := range maxDescriptors {
			desc := &ratelimitv3.RateLimitDescriptor{}
			for e := range maxEntries {
				key := "k"
				if e > 0 {
					key = "e" + strconv.Itoa(e)
				}
				desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: strconv.Itoa(d) + string(v)})
			}
			req.Descriptors = append(req.Descriptors, desc)
		}
		b, err := protov2.Marshal(req)
		if err != nil {
			panic(err)
		}
		return b
	}
	lo, hi := 0, size/(maxDescriptors*maxEntries)+1
	for lo < hi { // the longest value that fits
		mid := (lo + hi + 1) / 2
		if len(build(mid)) <= size {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return build(lo)
}

// dialFrom dials the server from the flood's own source address, so that
// the server sees it as a peer of its own.
func dialFrom(src string) func(context.Context, string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
}

// childFlood sends requests at the bounds from 64 callers on one
// connection, 8 MiB requests from 8 more and 4 MiB ones from 8 more,
// until its stdin closes. It
// prints "flooding" once the first requests are answered.
func childFlood() error {
	addr, src := os.Getenv(childAddrEnv), os.Getenv(childSrcEnv)
	atCaps := floodRequest(DefaultMaxRequestBytes - 16)
	huge := make(rawMsg, 8<<20)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	var wg sync.WaitGroup
	var answered atomic.Int64
	var once sync.Once
	send := func(msg rawMsg, callers int) error {
		cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(dialFrom(src)), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
		if err != nil {
			return err
		}
		for range callers {
			wg.Go(func() {
				for ctx.Err() == nil {
					var reply rlsv3.RateLimitResponse
					_ = cc.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &msg, &reply)
					if answered.Add(1) == 64 {
						once.Do(func() { fmt.Println("flooding") })
					}
				}
			})
		}
		go func() { <-ctx.Done(); wg.Wait(); cc.Close() }()
		return nil
	}
	if err := send(atCaps, 64); err != nil {
		return err
	}
	if err := send(huge, 8); err != nil {
		return err
	}
	if err := send(make(rawMsg, readBound-64), 8); err != nil { // read, not decoded
		return err
	}
	<-ctx.Done()
	wg.Wait()
	return nil
}

// childReset floods the server with HTTP/2 rapid resets (CVE-2023-44487)
// on 4 connections: bursts of HEADERS, each followed by RST_STREAM, with
// no DATA, reconnecting when a connection ends. It prints "flooding"
// after the first bursts and, when its stdin closes, "goaway N streams M":
// the GOAWAY frames it received and the streams it opened.
func childReset() error {
	addr, src := os.Getenv(childAddrEnv), os.Getenv(childSrcEnv)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	block := resetHeaderBlock(addr)
	var goaways, streams atomic.Int64
	var once sync.Once
	dial := dialFrom(src)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				conn, err := dial(ctx, addr)
				if err != nil {
					continue
				}
				resetConn(ctx, conn, block, &goaways, &streams, func() { once.Do(func() { fmt.Println("flooding") }) })
				conn.Close()
			}
		})
	}
	wg.Wait()
	fmt.Printf("goaway %d streams %d\n", goaways.Load(), streams.Load())
	return nil
}

// resetHeaderBlock is the HPACK block of a ShouldRateLimit call's
// HEADERS.
func resetHeaderBlock(addr string) []byte {
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName},
		{":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return hdr.Bytes()
}

// resetConn runs the rapid reset on one connection until it ends.
func resetConn(ctx context.Context, conn net.Conn, block []byte, goaways, streams *atomic.Int64, started func()) {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	go func() {
		fr := http2.NewFramer(io.Discard, conn)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				conn.Close()
				return
			}
			if g, ok := f.(*http2.GoAwayFrame); ok && g.ErrCode == http2.ErrCodeEnhanceYourCalm {
				goaways.Add(1)
			}
		}
	}()
	w := bufio.NewWriterSize(conn, 64<<10)
	fr := http2.NewFramer(w, nil)
	if _, err := w.WriteString(http2.ClientPreface); err != nil {
		return
	}
	if fr.WriteSettings() != nil {
		return
	}
	// A generous connection window, as a client that will read answers.
	if fr.WriteWindowUpdate(0, 1<<30) != nil {
		return
	}
	for id, n := uint32(1), 0; id < 1<<31-1; id += 2 {
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}) != nil ||
			fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
			return
		}
		streams.Add(1)
		if n++; n%100 == 0 {
			if w.Flush() != nil {
				return
			}
			started()
		}
	}
}
