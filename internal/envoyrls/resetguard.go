package envoyrls

// Rapid reset
//
// An HTTP/2 client can open a stream with HEADERS and cancel it at once
// with RST_STREAM (CVE-2023-44487): each costs the server a stream, a
// handler and its teardown, and costs the client two small frames. gRPC
// bounds the handlers of a connection (maxStreams) and sends GOAWAY for
// too many pings, but not for resets, and it reads on: a flood kept 2 s
// of work queued after it stopped. So the server's connections are read
// through frameConn, which watches the frame headers go by (nothing is
// copied or decoded): when the client has reset at least minResets
// streams and more than half of those it opened (counted over its last
// resetWindow or so streams; Envoy's premature-reset rule is alike), the
// connection gets GOAWAY (ENHANCE_YOUR_CALM, "too_many_resets") and is
// closed, and nothing more is read from it: every call still on it is
// cancelled and does no more work. The peer's new connections then wait
// out a cool-off (baseCoolOff, doubling per offence up to maxCoolOff,
// forgiven forgiveAfter after the last one): up to maxTarpit of them are
// held unread until it ends, which slows the flood down at its source,
// and more are closed at once. A client that cancels a few calls, or
// many in a burst among many more it completes, is never cut off.

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// Bounds of the rapid-reset rule.
const (
	minResets    = 128
	resetWindow  = 1024
	baseCoolOff  = time.Second
	maxCoolOff   = 30 * time.Second
	forgiveAfter = time.Minute
	maxTarpit    = 16
	// goawayWait bounds how long a GOAWAY waits for the server to finish
	// writing a frame before the connection is closed without it.
	goawayWait = time.Second
	// After a GOAWAY the connection is closed for writing (a FIN follows
	// the GOAWAY) and, unread, closed lingerTime later, as Go's HTTP
	// server does: closing a socket with unread data sends a TCP reset,
	// which would make the client drop the GOAWAY unread.
	lingerTime = 500 * time.Millisecond
)

// errRapidReset ends the server's reading of a connection cut off for
// rapid resets.
var errRapidReset = errors.New("envoyrls: connection closed: too many streams reset by the client")

// guardedListener accepts the gRPC server's connections within the
// peers' budgets and reads them through frameConn.
type guardedListener struct {
	net.Listener
	peers   *peers
	log     *slog.Logger
	metrics *metrics // may be nil
}

// guardListener returns lis accepting within lim, counting its refusals
// in m (which may be nil); a guarded listener is returned as it is.
func guardListener(lis net.Listener, lim Limits, log *slog.Logger, m *metrics) net.Listener {
	if _, ok := lis.(*guardedListener); ok {
		return lis
	}
	return &guardedListener{Listener: lis, peers: newPeers(lim), log: log, metrics: m}
}

// Accept returns the next connection within its peer's budget. Those
// beyond it are closed, or held while their peer cools off.
func (l *guardedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		p, why := l.peers.open(c.RemoteAddr())
		if why == "" {
			return newFrameConn(c, p, l), nil
		}
		l.metrics.refuse(why)
		l.peers.refuse(c, p)
	}
}

// refuse closes a connection that open did not accept, or, while its
// peer cools off, holds it unread until the cool-off ends.
func (ps *peers) refuse(c net.Conn, p *peerState) {
	if p == nil { // the table is full
		c.Close()
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	wait := p.coolUntil.Sub(ps.now())
	if wait <= 0 || p.tarpit >= maxTarpit {
		c.Close()
		ps.forget(p)
		return
	}
	p.tarpit++
	time.AfterFunc(wait, func() {
		c.Close()
		ps.mu.Lock()
		defer ps.mu.Unlock()
		p.tarpit--
		ps.forget(p)
	})
}

// offend records a rapid reset by p and returns its cool-off, and
// whether this offence started it (the flood's other connections join
// the same).
func (ps *peers) offend(p *peerState) (time.Duration, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	now := ps.now()
	if now.Before(p.coolUntil) {
		// Another connection of the same flood: one offence.
		return p.coolUntil.Sub(now), false
	}
	if now.After(p.coolUntil.Add(forgiveAfter)) {
		p.offences = 0
	}
	p.offences++
	cool := min(maxCoolOff, baseCoolOff<<min(p.offences-1, 8))
	p.coolUntil = now.Add(cool)
	return cool, true
}

// frameConn is a server connection whose HTTP/2 frames are watched for
// rapid resets (see Rapid reset).
type frameConn struct {
	net.Conn
	addr      *peerAddr
	l         *guardedListener
	closeOnce sync.Once

	// The read side; only the server's reader goroutine reads.
	in     frameScanner
	maxID  uint32
	opened int
	resets int
	cut    atomic.Bool // cut off for rapid resets

	// The write side.
	wmu     sync.Mutex
	out     frameScanner
	goaway  []byte // a GOAWAY to write at the next frame boundary
	stopped bool   // GOAWAY written, or given up: the connection is closed
}

func newFrameConn(c net.Conn, p *peerState, l *guardedListener) *frameConn {
	fc := &frameConn{Conn: c, addr: &peerAddr{Addr: c.RemoteAddr(), p: p}, l: l}
	fc.in.skip = len(http2.ClientPreface)
	return fc
}

// RemoteAddr is the peer's address, which carries its budgets to the
// call handler.
func (c *frameConn) RemoteAddr() net.Addr { return c.addr }

// Close closes the connection and releases its place in the peer's
// budget. A connection cut off for rapid resets lingers first (see
// lingerTime).
func (c *frameConn) Close() error {
	c.closeOnce.Do(func() {
		if !c.cut.Load() {
			c.Conn.Close()
			c.l.peers.close(c.addr.p)
			return
		}
		if tc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		time.AfterFunc(lingerTime, func() {
			c.Conn.Close()
			c.l.peers.close(c.addr.p)
		})
	})
	return nil
}

func (c *frameConn) Read(b []byte) (int, error) {
	if c.cut.Load() {
		return 0, errRapidReset
	}
	n, err := c.Conn.Read(b)
	c.in.scan(b[:n], c.onFrame)
	if c.cut.Load() {
		// What came with the last reset is dropped: no more work.
		return 0, errRapidReset
	}
	return n, err
}

// onFrame counts the streams the client opens and resets; it reports
// false when the connection is cut off.
func (c *frameConn) onFrame(h frameHeader) bool {
	switch h.typ {
	case http2.FrameHeaders:
		if h.stream > c.maxID { // a new stream; trailers are not
			c.maxID = h.stream
			if c.opened++; c.opened >= resetWindow {
				c.opened /= 2
				c.resets /= 2
			}
		}
	case http2.FrameRSTStream:
		c.resets++
		if c.resets >= minResets && 2*c.resets > c.opened {
			c.cutOff()
			return false
		}
	}
	return true
}

// cutOff ends a connection for rapid resets: GOAWAY, then close.
func (c *frameConn) cutOff() {
	c.cut.Store(true)
	c.l.metrics.refuse("rapid_reset")
	if cool, first := c.l.peers.offend(c.addr.p); first {
		c.l.log.Warn("envoyrls: gRPC connection closed with GOAWAY for rapid resets (CVE-2023-44487); the client's new connections wait out a cool-off",
			"peer", c.addr.String(), "streams_opened", c.opened, "streams_reset", c.resets, "cool_off", cool)
	}
	frame := make([]byte, 9+8+len(goawayDebug))
	binary.BigEndian.PutUint32(frame[0:4], uint32(8+len(goawayDebug))<<8|uint32(http2.FrameGoAway))
	binary.BigEndian.PutUint32(frame[9:13], c.maxID)
	binary.BigEndian.PutUint32(frame[13:17], uint32(http2.ErrCodeEnhanceYourCalm))
	copy(frame[17:], goawayDebug)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.out.atBoundary() {
		c.writeGoaway(frame)
		return
	}
	// The server is writing a frame: the GOAWAY follows it if the server
	// finishes it; if it closes the connection first (it stops reading
	// now), the connection ends without one.
	c.goaway = frame
	time.AfterFunc(goawayWait, func() {
		c.wmu.Lock()
		defer c.wmu.Unlock()
		if !c.stopped {
			c.stopped = true
			c.Close()
		}
	})
}

// goawayDebug is the GOAWAY's debug data.
const goawayDebug = "too_many_resets"

// writeGoaway writes frame and closes the connection; c.wmu is held.
func (c *frameConn) writeGoaway(frame []byte) {
	c.stopped = true
	_ = c.Conn.SetWriteDeadline(time.Now().Add(goawayWait))
	_, _ = c.Conn.Write(frame)
	c.Close()
}

func (c *frameConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.stopped {
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Write(b)
	c.out.scan(b[:n], nil)
	if c.goaway != nil && c.out.atBoundary() {
		c.writeGoaway(c.goaway)
	}
	return n, err
}

// frameHeader is an HTTP/2 frame header (RFC 9113, section 4.1).
type frameHeader struct {
	length int
	typ    http2.FrameType
	stream uint32
}

// frameScanner follows the frame boundaries of an HTTP/2 byte stream.
type frameScanner struct {
	skip int // bytes of the current payload (or the preface) still to come
	hdr  [9]byte
	nh   int // bytes of the next header held
}

// scan feeds b and calls f, if not nil, with each frame header as it
// completes, until f returns false.
func (s *frameScanner) scan(b []byte, f func(frameHeader) bool) {
	for len(b) > 0 {
		if s.skip > 0 {
			n := min(s.skip, len(b))
			s.skip -= n
			b = b[n:]
			continue
		}
		n := copy(s.hdr[s.nh:], b)
		s.nh += n
		b = b[n:]
		if s.nh < len(s.hdr) {
			return
		}
		s.nh = 0
		h := frameHeader{
			length: int(s.hdr[0])<<16 | int(s.hdr[1])<<8 | int(s.hdr[2]),
			typ:    http2.FrameType(s.hdr[3]),
			stream: binary.BigEndian.Uint32(s.hdr[5:9]) & (1<<31 - 1),
		}
		s.skip = h.length
		if f != nil && !f(h) {
			return
		}
	}
}

// atBoundary reports whether the stream is between two frames.
func (s *frameScanner) atBoundary() bool { return s.skip == 0 && s.nh == 0 }
