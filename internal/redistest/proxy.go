package redistest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy in front of one Redis, for faults of the network
// between a client and Redis: it can hold every byte (a black hole: it
// accepts and reads, and forwards nothing until released), delay every
// reply by a fixed time, cut every connection, or strand them (black holes
// for good, never closed).
type Proxy struct {
	// Hold, while shut (Store(true)), forwards nothing in either
	// direction; what arrives meanwhile is forwarded, in order, once it is
	// open again.
	Hold Gate
	// Delay is the ns every reply waits in the proxy after it arrived
	// from Redis; 0 forwards at once.
	Delay atomic.Int64

	ln     net.Listener
	target string

	mu    sync.Mutex
	links map[*link]struct{}
	wg    sync.WaitGroup
}

// link is one client connection and its connection to Redis.
type link struct {
	client, server net.Conn
	stranded       atomic.Bool // forwards nothing more, closes nothing
}

// NewProxy listens on a free loopback port and forwards to target (a
// host:port) until the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		p.Hold.Store(false)
		_ = ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns the proxy's redis:// URL.
func (p *Proxy) URL() string { return "redis://" + p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue // Redis is down: the client sees its connection closed
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		p.links[l] = struct{}{}
		p.mu.Unlock()
		p.pipe(l, c, s, false)
		p.pipe(l, s, c, true)
	}
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst: a reader queues what arrives, with its time, and
// a writer forwards it in order, once the proxy no longer holds and, for
// replies, once the delay has passed since it arrived.
func (p *Proxy) pipe(l *link, src, dst net.Conn, reply bool) {
	ch := make(chan chunk, 1024)
	p.wg.Go(func() {
		defer close(ch)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				ch <- chunk{b[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	})
	p.wg.Go(func() {
		defer func() { _ = dst.Close(); _ = src.Close() }()
		for c := range ch {
			p.Hold.Wait()
			if reply {
				// the simulated latency itself, not a synchronisation
				time.Sleep(time.Until(c.at.Add(time.Duration(p.Delay.Load()))))
			}
			if l.stranded.Load() {
				continue
			}
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	})
}

// Cut closes every connection through the proxy, as a network failure
// would; new connections are accepted as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		_ = l.client.Close()
		_ = l.server.Close()
		delete(p.links, l)
	}
}

// Strand makes every connection open now a black hole for good, as when
// Redis moved to another host and the old one drops every packet: they
// forward nothing more and are not closed (the client must find out by
// itself). New connections work as before.
func (p *Proxy) Strand() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.stranded.Store(true)
	}
}
