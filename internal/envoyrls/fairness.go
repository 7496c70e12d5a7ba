package envoyrls

// Fairness on the gRPC port
//
// One client must not slow the service for the others, whatever it sends.
// The unit of fairness is the peer, a client IP address: every Envoy is
// one, and so is an attacker who reaches the port. Each peer has budgets
// of its own, so that its heavy calls queue behind each other and not in
// front of everyone's:
//
//   - Connections: at most Limits.MaxConnsPerPeer open at once; more are
//     closed as soon as they are accepted.
//   - Calls: at most maxPeerCalls in the handler at once (waiting or
//     working); more are answered OVER_LIMIT before their message is read.
//     gRPC bounds calls per connection (maxStreams) and a call's message
//     (Limits.MaxRequestBytes, checked from its length prefix before the
//     message is read); a larger message is answered OVER_LIMIT unread.
//     Both answers have no descriptor statuses (the message is not read),
//     and neither is an error, which an Envoy with failure_mode_deny:
//     false would let through, limits and all.
//   - Reads: at most maxPeerReads messages read but not yet decoded, so a
//     peer's messages wait in HTTP/2 flow control (streamWindow each), not
//     in memory.
//   - Work: a call's message bytes are its cost (its descriptors, entries
//     and values all take bytes), taken from a budget of
//     peerWorkRequests × MaxRequestBytes per peer, first come first
//     served, after the message is read and before it is decoded, and
//     held until the call is answered. A peer runs at most
//     peerWorkRequests calls at the caps at once; hundreds of ordinary
//     ones (a few hundred bytes each).
//   - A call whose context has ended (the client reset its stream, or its
//     deadline passed) does no work: it stops at each of these gates.
//
// So a peer holds at most about
// maxPeerCalls × streamWindow + maxPeerReads × MaxRequestBytes +
// peerWorkRequests × MaxRequestBytes × decodeFactor bytes (16 MiB + 2 MiB +
// 4 MiB at the defaults). HTTP/2 rapid resets (resetguard.go) end the
// connection with GOAWAY, and the peer's new connections wait out a
// cool-off.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Defaults and bounds of Limits.
const (
	// DefaultMaxRequestBytes bounds one call's message: 256 descriptors of
	// 64 entries with 50-byte values fit, and so do a few descriptors that
	// carry a header at Envoy's largest default header size (60 KiB);
	// Envoy's requests are a few hundred bytes. gRPC's default is 4 MiB.
	DefaultMaxRequestBytes = 1 << 20
	// MinMaxRequestBytes and MaxMaxRequestBytes bound max_request_bytes.
	MinMaxRequestBytes = 4 << 10
	MaxMaxRequestBytes = 4 << 20
	// DefaultMaxConnsPerPeer bounds one client IP's open connections.
	// Envoy opens one or a few per worker thread.
	DefaultMaxConnsPerPeer = 64
	// MaxMaxConnsPerPeer bounds max_conns_per_peer.
	MaxMaxConnsPerPeer = 4096
)

// Fixed per-peer budgets (see Fairness on the gRPC port).
const (
	maxPeerCalls     = 1024
	maxPeerReads     = 8
	peerWorkRequests = 1
	// maxPeers bounds the peers known at once: the peers with a
	// connection open and those cooling off after a rapid reset.
	maxPeers = 1 << 16
)

// Limits bound what one peer (a client IP address) can make the gRPC
// server do. The zero value means the defaults.
type Limits struct {
	// MaxRequestBytes bounds one call's message; a larger one is refused
	// (RESOURCE_EXHAUSTED) from its length before it is read. Zero means
	// DefaultMaxRequestBytes.
	MaxRequestBytes int
	// MaxConnsPerPeer bounds one client IP's open connections; more are
	// closed when accepted. Zero means DefaultMaxConnsPerPeer.
	MaxConnsPerPeer int
}

// withDefaults returns l with its zero fields set to the defaults.
func (l Limits) withDefaults() Limits {
	if l.MaxRequestBytes == 0 {
		l.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if l.MaxConnsPerPeer == 0 {
		l.MaxConnsPerPeer = DefaultMaxConnsPerPeer
	}
	return l
}

// Validate checks l's fields against their bounds; zero fields are the
// defaults.
func (l Limits) Validate() error {
	if n := l.MaxRequestBytes; n != 0 && (n < MinMaxRequestBytes || n > MaxMaxRequestBytes) {
		return fmt.Errorf("max_request_bytes %d: must be between %d and %d", n, MinMaxRequestBytes, MaxMaxRequestBytes)
	}
	if n := l.MaxConnsPerPeer; n < 0 || n > MaxMaxConnsPerPeer {
		return fmt.Errorf("max_conns_per_peer %d: must be between 1 and %d", n, MaxMaxConnsPerPeer)
	}
	return nil
}

// peers is the table of the peers that have a connection open or are
// cooling off; a peer leaves it when neither holds.
type peers struct {
	lim Limits
	now func() time.Time

	mu sync.Mutex
	m  map[netip.Addr]*peerState
}

func newPeers(lim Limits) *peers {
	return &peers{lim: lim.withDefaults(), now: time.Now, m: map[netip.Addr]*peerState{}}
}

// peerState is one peer's budgets.
type peerState struct {
	ip    netip.Addr
	calls atomic.Int64
	reads chan struct{}
	work  *semaphore.Weighted
	limit int64 // the work budget

	// Guarded by peers.mu.
	conns     int
	tarpit    int       // connections held unread while cooling off
	offences  int       // rapid resets, forgiven after a calm cool-off
	coolUntil time.Time // new connections are not served before
}

// peerAddr is the remote address of a guarded connection: the address,
// and the peer's budgets for the call handler to find.
type peerAddr struct {
	net.Addr
	p *peerState
}

// open registers a new connection from addr. It returns the peer, or nil
// and why the connection is not to be served.
func (ps *peers) open(addr net.Addr) (*peerState, string) {
	ip := ipOf(addr)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[ip]
	if p == nil {
		if len(ps.m) >= maxPeers {
			return nil, "too many peers"
		}
		limit := int64(peerWorkRequests * ps.lim.MaxRequestBytes)
		p = &peerState{ip: ip, reads: make(chan struct{}, maxPeerReads), work: semaphore.NewWeighted(limit), limit: limit}
		ps.m[ip] = p
	}
	if ps.now().Before(p.coolUntil) {
		return p, "cooling off after a rapid reset"
	}
	if p.conns >= ps.lim.MaxConnsPerPeer {
		return p, "too many connections from the peer"
	}
	p.conns++
	return p, ""
}

// close unregisters a connection that open accepted.
func (ps *peers) close(p *peerState) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p.conns--
	ps.forget(p)
}

// forget drops p from the table when nothing holds it. ps.mu is held.
func (ps *peers) forget(p *peerState) {
	if p.conns == 0 && p.tarpit == 0 && !ps.now().Before(p.coolUntil.Add(forgiveAfter)) {
		delete(ps.m, p.ip)
	}
}

func ipOf(addr net.Addr) netip.Addr {
	if a, ok := addr.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{} // not IP (a Unix socket): one peer
}

// callPeer returns the budgets of the peer of a call, or nil when the
// call did not come through a guarded listener.
func callPeer(ctx context.Context) *peerState {
	if pr, ok := peer.FromContext(ctx); ok {
		if a, ok := pr.Addr.(*peerAddr); ok {
			return a.p
		}
	}
	return nil
}

// refuseUnread answers a call whose message is not read (too large, or
// beyond its peer's calls): OVER_LIMIT, counted as over the bounds.
func refuseUnread(srv any) *rlsv3.RateLimitResponse {
	if s, ok := srv.(*Service); ok {
		s.metrics.unknown.tooLarge.Inc()
		s.metrics.unknown.over.Inc()
	}
	return overLimitAll(0)
}

// gatedRequest is what the call handler decodes into: the codec takes
// the message's cost from the peer's work budget before decoding it
// (codec.go).
type gatedRequest struct {
	ctx    context.Context
	p      *peerState
	req    rlsv3.RateLimitRequest
	weight int64 // taken from p.work
}

// admit takes the cost of a message of n bytes from the peer's work
// budget, waiting its turn behind the peer's earlier calls.
func (g *gatedRequest) admit(n int) error {
	if g.p == nil {
		return nil
	}
	w := min(max(int64(n), 1), g.p.limit)
	if err := g.p.work.Acquire(g.ctx, w); err != nil {
		return status.FromContextError(err).Err()
	}
	g.weight = w
	return nil
}

// decodeFailed answers a call whose message could not be read or decoded:
// OVER_LIMIT for one over Limits.MaxRequestBytes, which gRPC refuses from
// its length, else the error.
func decodeFailed(srv any, err error) (any, error) {
	if status.Code(err) == codes.ResourceExhausted {
		return refuseUnread(srv), nil
	}
	return nil, err
}

// rateLimitServiceDesc is the rate-limit service with its one method
// behind the peer's budgets.
var rateLimitServiceDesc = func() grpc.ServiceDesc {
	d := rlsv3.RateLimitService_ServiceDesc
	d.Methods = []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: gatedShouldRateLimit}}
	return d
}()

// gatedShouldRateLimit is the ShouldRateLimit handler: the generated one,
// with the peer's budgets taken before the message is read and decoded.
func gatedShouldRateLimit(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	if ctx.Err() != nil {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	g := &gatedRequest{ctx: ctx, p: callPeer(ctx)}
	if p := g.p; p != nil {
		if p.calls.Add(1) > maxPeerCalls {
			p.calls.Add(-1)
			return refuseUnread(srv), nil
		}
		defer p.calls.Add(-1)
		select {
		case p.reads <- struct{}{}:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		err := dec(g)
		<-p.reads
		if g.weight > 0 {
			defer p.work.Release(g.weight)
		}
		if err != nil {
			return decodeFailed(srv, err)
		}
	} else if err := dec(g); err != nil {
		return decodeFailed(srv, err)
	}
	if ctx.Err() != nil { // reset while it waited: no work for it
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	h := srv.(rlsv3.RateLimitServiceServer)
	if interceptor == nil {
		return h.ShouldRateLimit(ctx, &g.req)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, &g.req, info, func(ctx context.Context, req any) (any, error) {
		return h.ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	})
}
