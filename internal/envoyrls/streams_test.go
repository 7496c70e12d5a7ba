package envoyrls

import (
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// The server bounds the calls in flight on one connection: a client that
// opens streams and never reads their answers would otherwise hold a
// goroutine per stream, without bound. The bound is what the server
// advertises in its HTTP/2 SETTINGS.
func TestStreamsPerConnectionBounded(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := NewGRPCServerFor(nil)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // bounds the test, not its timing
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			continue
		}
		v, ok := sf.Value(http2.SettingMaxConcurrentStreams)
		if !ok || v > maxStreams {
			t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d (sent: %v), want at most %d", v, ok, maxStreams)
		}
		return
	}
}
