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
//     gRPC bounds the calls of one connection (maxStreams).
//   - Reads: at most maxPeerReads messages being read or decoded at once,
//     so that a peer's other messages wait in HTTP/2 flow control
//     (streamWindow each), not in memory. gRPC reads a message of at most
//     readBound (4 MiB, its own default) and refuses a larger one from its
//     length prefix, unread, with RESOURCE_EXHAUSTED.
//   - Size: a message over Limits.MaxRequestBytes is answered OVER_LIMIT
//     without being decoded.
//   - Work: a call's message bytes are its cost (its descriptors, entries
//     and values all take bytes), taken from a budget of
//     peerWorkRequests × MaxRequestBytes per peer, first come first
//     served, once the message is read and before it is decoded, and
//     held until the call is answered. A peer runs one call at the caps
//     at a time, or hundreds of ordinary ones (a few hundred bytes each).
//   - A call whose context has ended (the client reset its stream, or its
//     deadline passed) does no work: it stops at each of these gates.
//
// A call refused unread has no descriptor statuses (its message is not
// decoded); it is OVER_LIMIT and not an error, which an Envoy with
// failure_mode_deny: false would let through, limits and all. So a peer
// holds at most about maxPeerCalls × streamWindow (16 MiB) waiting,
// maxPeerReads × readBound (16 MiB) read, and its work budget decoded
// (1 MiB of messages, a few MiB decoded). HTTP/2 rapid resets
// (resetguard.go) end the connection with GOAWAY, and the peer's new
// connections wait out a cool-off.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
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
	MaxMaxRequestBytes = readBound
	// DefaultMaxConnsPerPeer bounds one client IP's open connections.
	// Envoy opens one or a few per worker thread.
	DefaultMaxConnsPerPeer = 64
	// MaxMaxConnsPerPeer bounds max_conns_per_peer.
	MaxMaxConnsPerPeer = 4096
)

// Fixed per-peer budgets (see Fairness on the gRPC port).
const (
	maxPeerCalls     = 1024
	maxPeerReads     = 4
	peerWorkRequests = 1
	// readBound is the largest message gRPC reads (its default): a larger
	// one is refused from its length with RESOURCE_EXHAUSTED, as
	// envoyproxy/ratelimit does.
	readBound = 4 << 20
	// maxPeers bounds the peers known at once: the peers with a
	// connection open and those cooling off after a rapid reset (the
	// latter are dropped first when the table is full).
	maxPeers = 1 << 16
)

// Limits bound what one peer (a client IP address) can make the gRPC
// server do. The zero value means the defaults.
type Limits struct {
	// MaxRequestBytes bounds the message of a call that is decoded; a
	// larger one is answered OVER_LIMIT undecoded. Zero means
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
	work  *workBudget
	limit int64 // the work budget
	max   int   // Limits.MaxRequestBytes

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

// open registers a new connection from addr. It returns the peer and,
// when the connection is not to be served, why: peer_table (the peer is
// then nil), cool_off or conns_per_peer.
func (ps *peers) open(addr net.Addr) (*peerState, string) {
	ip := ipOf(addr)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[ip]
	if p == nil {
		if len(ps.m) >= maxPeers {
			ps.sweep()
		}
		if len(ps.m) >= maxPeers {
			return nil, "peer_table"
		}
		p = ps.newPeer()
		p.ip = ip
		ps.m[ip] = p
	}
	if ps.now().Before(p.coolUntil) {
		return p, "cool_off"
	}
	if p.conns >= ps.lim.MaxConnsPerPeer {
		return p, "conns_per_peer"
	}
	p.conns++
	return p, ""
}

// sweep drops the peers that hold no connection, cooling off or not: a
// full table must not refuse a new peer for the sake of old cool-offs
// (an attacker of many addresses could fill it). ps.mu is held.
func (ps *peers) sweep() {
	for ip, p := range ps.m {
		if p.conns == 0 && p.tarpit == 0 {
			delete(ps.m, ip)
		}
	}
}

// newPeer returns the budgets of a new peer.
func (ps *peers) newPeer() *peerState {
	limit := int64(peerWorkRequests * ps.lim.MaxRequestBytes)
	return &peerState{reads: make(chan struct{}, maxPeerReads), work: newWorkBudget(limit), limit: limit, max: ps.lim.MaxRequestBytes}
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

// refuseUnread answers a call whose message is not decoded (too large, or
// beyond its peer's calls): OVER_LIMIT, counted as over the bounds and
// refused for reason.
func refuseUnread(srv any, reason string) *rlsv3.RateLimitResponse {
	if s, ok := srv.(*Service); ok {
		s.metrics.unknown.tooLarge.Inc()
		s.metrics.unknown.over.Inc()
		s.metrics.refuse(reason)
	}
	return overLimitAll(0)
}

// gatedRequest is what the call handler decodes into: the codec takes
// the message's cost from the peer's work budget before decoding it
// (codec.go).
type gatedRequest struct {
	ctx      context.Context
	p        *peerState
	req      rlsv3.RateLimitRequest
	weight   int64 // taken from p.work
	oversize bool  // over MaxRequestBytes: not decoded
}

// serviceCall is a gatedRequest to a Service, with the memory of its
// answer (callSpace) in the same allocation.
type serviceCall struct {
	gatedRequest
	space callSpace
}

// admit takes the cost of a message of n bytes from the peer's work
// budget, waiting its turn behind the peer's earlier calls. It reports
// false for a message over MaxRequestBytes, which is not to be decoded.
func (g *gatedRequest) admit(n int) (bool, error) {
	maxBytes := DefaultMaxRequestBytes
	if g.p != nil {
		maxBytes = g.p.max
	}
	if n > maxBytes {
		g.oversize = true
		return false, nil
	}
	if g.p == nil {
		return true, nil
	}
	w := min(max(int64(n), 1), g.p.limit)
	if err := g.p.work.acquire(g.ctx, w); err != nil {
		return false, status.FromContextError(err).Err()
	}
	g.weight = w
	return true, nil
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
	// A Service's call: the answer's memory comes with the request's.
	svc, _ := srv.(*Service)
	var space *callSpace
	var g *gatedRequest
	if svc != nil && interceptor == nil {
		c := &serviceCall{gatedRequest: gatedRequest{ctx: ctx, p: callPeer(ctx)}}
		g, space = &c.gatedRequest, &c.space
	} else {
		g = &gatedRequest{ctx: ctx, p: callPeer(ctx)}
	}
	if p := g.p; p != nil {
		if p.calls.Add(1) > maxPeerCalls {
			p.calls.Add(-1)
			return refuseUnread(srv, "peer_calls"), nil
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
			defer p.work.release(g.weight)
		}
		if err != nil {
			return nil, err
		}
	} else if err := dec(g); err != nil {
		return nil, err
	}
	if g.oversize {
		return refuseUnread(srv, "oversize"), nil
	}
	if ctx.Err() != nil { // reset while it waited: no work for it
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if space != nil {
		return svc.shouldRateLimit(ctx, &g.req, space)
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
