package envoyrls

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/sluice-io/sluice/internal/redistest"
)

// The bounds of fairness.go and resetguard.go, one test each; the floods
// that they add up to are in fairness_test.go.

// A message over DefaultMaxRequestBytes is answered OVER_LIMIT without
// being decoded: never an error, which an Envoy with failure_mode_deny:
// false would let through.
func TestOversizeMessageOverLimit(t *testing.T) {
	e := newEnv(t, memStore, "testdata/config", nil)
	msg := make(rawMsg, DefaultMaxRequestBytes+1) // zero bytes: not even valid protobuf
	resp := &rlsv3.RateLimitResponse{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := e.conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &msg, resp, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		t.Fatalf("a %d-byte message: error %v; Envoy with failure_mode_deny: false would let it through", len(msg), err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a %d-byte message: %v, want OVER_LIMIT", len(msg), resp.GetOverallCode())
	}
	if n := testutil.ToFloat64(e.svc.metrics.refused.WithLabelValues("oversize")); n != 1 {
		t.Fatalf("sluice_envoy_rls_refused_total{reason=oversize} %v, want 1", n)
	}
}

// withPeer is a call's context from a guarded connection of p.
func withPeer(ctx context.Context, p *peerState) context.Context {
	return peer.NewContext(ctx, &peer.Peer{Addr: &peerAddr{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, p: p}})
}

// countingHandler counts the calls that reach the service.
type countingHandler struct {
	rlsv3.UnimplementedRateLimitServiceServer
	calls int
}

func (h *countingHandler) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	h.calls++
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// A call whose client has reset it (its context ended) does no work: its
// message is not read, nor is the service asked.
func TestCancelledCallDoesNoWork(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for name, ctx := range map[string]context.Context{"unguarded": ctx, "guarded": withPeer(ctx, newPeers(Limits{}).newPeer())} {
		h := &countingHandler{}
		read := false
		_, err := gatedShouldRateLimit(h, ctx, func(any) error { read = true; return nil }, nil)
		if err == nil || read || h.calls != 0 {
			t.Errorf("%s: a cancelled call: error %v, message read %v, service asked %d times", name, err, read, h.calls)
		}
	}
}

// A peer's calls beyond maxPeerCalls are answered OVER_LIMIT unread.
func TestPeerCallsBounded(t *testing.T) {
	p := newPeers(Limits{}).newPeer()
	p.calls.Store(maxPeerCalls)
	h := &countingHandler{}
	read := false
	resp, err := gatedShouldRateLimit(h, withPeer(context.Background(), p), func(any) error { read = true; return nil }, nil)
	if err != nil || resp.(*rlsv3.RateLimitResponse).GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || read || h.calls != 0 {
		t.Fatalf("call %d of a peer: %v %v, message read %v, service asked %d times; want OVER_LIMIT unread", maxPeerCalls+1, resp, err, read, h.calls)
	}
	p.calls.Store(0)
	if resp, err := gatedShouldRateLimit(h, withPeer(context.Background(), p), func(any) error { return nil }, nil); err != nil ||
		resp.(*rlsv3.RateLimitResponse).GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a peer's first call: %v %v", resp, err)
	}
}

// A peer's work budget is MaxRequestBytes of messages at once: a second
// message waits for the first call to end, then goes; one whose client
// gives up while it waits does no work.
func TestPeerWorkBudget(t *testing.T) {
	const size = 64 << 10
	p := newPeers(Limits{MaxRequestBytes: size}).newPeer()
	first := &gatedRequest{ctx: context.Background(), p: p}
	if _, err := first.admit(size); err != nil || first.weight != size {
		t.Fatalf("first message: %v, weight %d", err, first.weight)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waiting := &gatedRequest{ctx: ctx, p: p}
	done := make(chan error, 1)
	go func() { _, err := waiting.admit(1); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("a second message went beside a first at the budget: %v", err)
	case <-time.After(50 * time.Millisecond): // it waits (what is asserted is that it did not go)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a message whose call was cancelled while it waited was admitted")
	}
	second := &gatedRequest{ctx: context.Background(), p: p}
	go func() { _, err := second.admit(size); done <- err }()
	p.work.release(first.weight)
	if err := <-done; err != nil || second.weight != size {
		t.Fatalf("after the first: %v, weight %d", err, second.weight)
	}
	if decode, err := (&gatedRequest{ctx: context.Background(), p: p}).admit(size + 1); decode || err != nil {
		t.Fatalf("a message over MaxRequestBytes: decode %v, %v", decode, err)
	}
}

// rawClient opens an HTTP/2 connection to addr and returns its framer.
func rawClient(t *testing.T, addr string) (*http2.Framer, net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // bounds a broken server, not the test's timing
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return fr, conn
}

// guardedServer serves a no-op handler on a guarded listener.
func guardedServer(t *testing.T, lim Limits) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := NewGRPCServerFor(&countingHandler{})
	go func() { _ = g.Serve(guardListener(lis, lim, slog.New(slog.DiscardHandler), nil)) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// A client IP's connections beyond MaxConnsPerPeer are closed at once.
func TestConnsPerPeerBounded(t *testing.T) {
	addr := guardedServer(t, Limits{MaxConnsPerPeer: 2})
	for i := range 2 {
		fr, _ := rawClient(t, addr)
		if f, err := fr.ReadFrame(); err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		} else if _, ok := f.(*http2.SettingsFrame); !ok {
			t.Fatalf("connection %d: first frame %T, want SETTINGS", i+1, f)
		}
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // bounds a broken server, not the test's timing
	if n, err := conn.Read(make([]byte, 64)); err == nil {
		t.Fatalf("connection 3 of a peer allowed 2: read %d bytes, want it closed", n)
	}
}

// readGoAway reads frames until a GOAWAY and returns it.
func readGoAway(t *testing.T, fr *http2.Framer) *http2.GoAwayFrame {
	t.Helper()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("connection ended without GOAWAY: %v", err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			return g
		}
	}
}

// A client that pings more often than keepaliveMinTime gets GOAWAY
// (ENHANCE_YOUR_CALM, too_many_pings).
func TestPingFloodGoAway(t *testing.T) {
	fr, _ := rawClient(t, guardedServer(t, Limits{}))
	for i := range 10 {
		if err := fr.WritePing(false, [8]byte{byte(i)}); err != nil {
			break // closed after the GOAWAY
		}
	}
	g := readGoAway(t, fr)
	if g.ErrCode != http2.ErrCodeEnhanceYourCalm || string(g.DebugData()) != "too_many_pings" {
		t.Fatalf("GOAWAY %v %q, want ENHANCE_YOUR_CALM too_many_pings", g.ErrCode, g.DebugData())
	}
}

// minResets streams opened and reset at once end the connection with
// GOAWAY (ENHANCE_YOUR_CALM, too_many_resets) naming the last stream; a
// client that completes its calls and cancels a few is never cut off.
func TestRapidResetGoAway(t *testing.T) {
	addr := guardedServer(t, Limits{})
	fr, _ := rawClient(t, addr)
	block := resetHeaderBlock(addr)
	var id uint32
	for id = 1; id < 2*minResets+1; id += 2 {
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}) != nil ||
			fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
			break
		}
	}
	g := readGoAway(t, fr)
	if g.ErrCode != http2.ErrCodeEnhanceYourCalm || string(g.DebugData()) != goawayDebug || g.LastStreamID != 2*minResets-1 {
		t.Fatalf("GOAWAY %v %q last stream %d, want ENHANCE_YOUR_CALM %s %d", g.ErrCode, g.DebugData(), g.LastStreamID, goawayDebug, 2*minResets-1)
	}
}

// A connection that resets fewer than half its streams keeps going.
func TestSomeResetsKeepConnection(t *testing.T) {
	c := &frameConn{l: &guardedListener{peers: newPeers(Limits{}), log: slog.New(slog.DiscardHandler)}}
	c.addr = &peerAddr{Addr: &net.TCPAddr{}, p: c.l.peers.newPeer()}
	for id := uint32(1); id < 20*resetWindow; id += 2 {
		c.onFrame(frameHeader{typ: http2.FrameHeaders, stream: id})
		if id%3 == 0 && !c.onFrame(frameHeader{typ: http2.FrameRSTStream, stream: id}) {
			t.Fatalf("cut off after %d streams of which a third were reset", id/2+1)
		}
	}
	if c.cut.Load() {
		t.Fatal("cut off")
	}
}

// The frame scanner finds frame boundaries however the bytes are split.
func TestFrameScanner(t *testing.T) {
	var b strings.Builder
	fr := http2.NewFramer(&b, nil)
	_ = fr.WriteSettings()
	_ = fr.WriteData(1, false, make([]byte, 1000))
	_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
	_ = fr.WritePing(false, [8]byte{})
	wire := []byte(b.String())
	want := []http2.FrameType{http2.FrameSettings, http2.FrameData, http2.FrameRSTStream, http2.FramePing}
	for _, chunk := range []int{1, 2, 7, 9, 10, 100, len(wire)} {
		var s frameScanner
		var got []http2.FrameType
		for i := 0; i < len(wire); i += chunk {
			s.scan(wire[i:min(i+chunk, len(wire))], func(h frameHeader) bool { got = append(got, h.typ); return true })
		}
		if len(got) != len(want) || !s.atBoundary() {
			t.Fatalf("chunks of %d: frames %v, at a boundary %v; want %v", chunk, got, s.atBoundary(), want)
		}
	}
}

// Limits out of range are refused with the bound.
func TestLimitsValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{ConfigDir: "d", MaxRequestBytes: 1000}, "max_request_bytes 1000: must be between 4096 and 4194304"},
		{Config{ConfigDir: "d", MaxRequestBytes: 8 << 20}, "max_request_bytes 8388608: must be between 4096 and 4194304"},
		{Config{ConfigDir: "d", MaxRequestBytes: -1}, "max_request_bytes -1: must be between 4096 and 4194304"},
		{Config{ConfigDir: "d", MaxConnsPerPeer: -1}, "max_conns_per_peer -1: must be between 1 and 4096"},
		{Config{ConfigDir: "d", MaxConnsPerPeer: 5000}, "max_conns_per_peer 5000: must be between 1 and 4096"},
		{Config{ConfigDir: "d", MaxRequestBytes: 4 << 10, MaxConnsPerPeer: 1}, ""},
		{Config{ConfigDir: "d"}, ""},
	} {
		err := c.cfg.Validate()
		if (err == nil) != (c.want == "") || (err != nil && err.Error() != c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}

// The peer table is bounded: when it is full, peers cooling off without
// a connection make room for a new peer; peers with connections do not.
func TestPeerTableBounded(t *testing.T) {
	ps := newPeers(Limits{})
	addr := func(i int) net.Addr { return &net.TCPAddr{IP: net.IP{10, byte(i >> 16), byte(i >> 8), byte(i)}} }
	for i := range maxPeers {
		p, why := ps.open(addr(i))
		if why != "" {
			t.Fatalf("peer %d: %s", i, why)
		}
		if i%2 == 0 { // half leave after a rapid reset: cooling, no connection
			ps.offend(p)
			ps.close(p)
		}
	}
	if len(ps.m) != maxPeers {
		t.Fatalf("%d peers known, want %d (the cooling ones kept)", len(ps.m), maxPeers)
	}
	if _, why := ps.open(addr(maxPeers)); why != "" {
		t.Fatalf("a new peer beside a table full of cool-offs: %s", why)
	}
	if len(ps.m) != maxPeers/2+1 {
		t.Fatalf("%d peers known after the sweep, want %d", len(ps.m), maxPeers/2+1)
	}
	for i := maxPeers + 1; len(ps.m) < maxPeers; i++ {
		if _, why := ps.open(addr(i)); why != "" {
			t.Fatalf("peer %d: %s", i, why)
		}
	}
	if p, why := ps.open(addr(1 << 23)); why == "" || p != nil {
		t.Fatalf("peer %d of a table full of connected peers: %v %q, want refused", maxPeers+1, p, why)
	}
}

// The work budget serves its waiters in order: a light call behind a
// heavy one waits for it; when the heavy one gives up, the light one goes.
func TestWorkBudgetFirstComeFirstServed(t *testing.T) {
	b := newWorkBudget(10)
	if err := b.acquire(context.Background(), 6); err != nil {
		t.Fatal(err)
	}
	heavyCtx, giveUp := context.WithCancel(context.Background())
	heavy, light := make(chan error, 1), make(chan error, 1)
	go func() { heavy <- b.acquire(heavyCtx, 10) }()
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool { // the heavy call is waiting
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.waiters.Len() == 1
	}) {
		t.Fatal("the heavy call is not waiting")
	}
	go func() { light <- b.acquire(context.Background(), 1) }()
	select {
	case err := <-light:
		t.Fatalf("a light call went ahead of the heavy one waiting before it: %v", err)
	case <-time.After(50 * time.Millisecond): // it waits (what is asserted is that it did not go)
	}
	giveUp()
	if err := <-heavy; err == nil {
		t.Fatal("the heavy call that gave up was granted")
	}
	if err := <-light; err != nil {
		t.Fatal(err)
	}
	b.release(6)
	b.release(1)
	if b.used != 0 {
		t.Fatalf("%d used after every release", b.used)
	}
}

// A peer cut off for rapid resets has its new connections refused for a
// cool-off of baseCoolOff, doubling per offence up to maxCoolOff; the
// flood's other connections cut meanwhile are the same offence, and a
// peer calm for forgiveAfter starts over.
func TestRapidResetCoolOff(t *testing.T) {
	ps := newPeers(Limits{})
	now := time.Unix(1_000_000, 0)
	ps.now = func() time.Time { return now }
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}
	p, why := ps.open(addr)
	if why != "" {
		t.Fatal(why)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i, w := range want {
		cool, first := ps.offend(p)
		if cool != w || !first {
			t.Fatalf("offence %d: cool-off %v (first %v), want %v", i+1, cool, first, w)
		}
		if again, first := ps.offend(p); first || again != w {
			t.Fatalf("offence %d, another connection: cool-off %v (first %v), want the same %v", i+1, again, first, w)
		}
		now = now.Add(w - time.Nanosecond)
		if _, why := ps.open(addr); why == "" {
			t.Fatalf("offence %d: a new connection before the cool-off ended was served", i+1)
		}
		now = now.Add(time.Nanosecond)
		if _, why := ps.open(addr); why != "" {
			t.Fatalf("offence %d: a new connection after the cool-off: %s", i+1, why)
		}
	}
	now = now.Add(forgiveAfter + time.Nanosecond)
	if cool, _ := ps.offend(p); cool != baseCoolOff {
		t.Fatalf("after %v calm: cool-off %v, want %v", forgiveAfter, cool, baseCoolOff)
	}
}
