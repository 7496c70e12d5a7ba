// Package regiontest links regions on one machine for tests: a TCP proxy
// that delays every byte by a one-way latency and can partition the link
// (WAN), and a World of three regions, each its own redis-server, with
// region.Stores over them (world.go).
package regiontest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// WAN is a TCP proxy standing for the link between two regions: every
// byte is delayed by a one-way latency in each direction (so a round
// trip costs twice that, as between data centres), and Partition cuts
// the link as a network partition does: open connections stop forwarding
// and are closed, and new ones are accepted but black-holed (the client
// connects, then hears nothing: it must time out, as across a real
// partition, where SYNs or data are dropped, not refused) until Heal.
type WAN struct {
	oneWay time.Duration
	target string
	ln     net.Listener
	cut    atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewWAN listens on a free loopback port and forwards to target with
// oneWay latency each way, until the test ends.
func NewWAN(t testing.TB, target string, oneWay time.Duration) *WAN {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &WAN{oneWay: oneWay, target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	w.wg.Go(w.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		w.closeAll()
		w.wg.Wait()
	})
	return w
}

// URL is the redis:// URL through the link.
func (w *WAN) URL() string { return "redis://" + w.ln.Addr().String() }

// Partition cuts the link until Heal.
func (w *WAN) Partition() {
	w.cut.Store(true)
	w.closeAll()
}

// Heal ends a partition: the black-holed connections are closed (their
// clients redial) and new ones forward again.
func (w *WAN) Heal() {
	w.cut.Store(false)
	w.closeAll()
}

func (w *WAN) track(c net.Conn) {
	w.mu.Lock()
	w.conns[c] = struct{}{}
	w.mu.Unlock()
}

func (w *WAN) closeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for c := range w.conns {
		_ = c.Close()
		delete(w.conns, c)
	}
}

func (w *WAN) accept() {
	for {
		c, err := w.ln.Accept()
		if err != nil {
			return
		}
		w.track(c)
		if w.cut.Load() {
			// Black hole: read and drop, answer nothing.
			w.wg.Go(func() {
				b := make([]byte, 4096)
				for {
					if _, err := c.Read(b); err != nil {
						return
					}
				}
			})
			continue
		}
		s, err := net.Dial("tcp", w.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		w.track(s)
		w.pipe(c, s)
		w.pipe(s, c)
	}
}

type timed struct {
	b  []byte
	at time.Time
}

// pipe forwards src to dst, each chunk oneWay after it arrived, in order.
func (w *WAN) pipe(src, dst net.Conn) {
	ch := make(chan timed, 4096)
	w.wg.Go(func() {
		defer close(ch)
		for {
			b := make([]byte, 16<<10)
			n, err := src.Read(b)
			if n > 0 && !w.cut.Load() {
				ch <- timed{b[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	})
	w.wg.Go(func() {
		defer func() { _ = dst.Close(); _ = src.Close() }()
		for c := range ch {
			// the simulated latency itself, not a synchronisation
			time.Sleep(time.Until(c.at.Add(w.oneWay)))
			if w.cut.Load() {
				return
			}
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	})
}
