package gateway

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/fakeopenai"
)

// A client that sends its headers and then trickles its body (or stops)
// held a goroutine and a connection for as long as it liked: the gateway's
// listener has no read timeout, since streams last as long as the
// upstream's. Now a body must arrive within the body timeout; past it the
// client gets 408 and the connection is closed.
func TestSlowBodyTimesOut(t *testing.T) {
	e := newEnv(t, Limits{RPM: 100, TPM: 100000}, fakeopenai.Options{})
	e.gw.bodyTimeout = 100 * time.Millisecond
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		clientKey, len(body)+1000, body[:10])
	// The client stops there. A read deadline far past the body timeout
	// bounds the test, not its timing.
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d, want 408", resp.StatusCode)
	}
	if !resp.Close {
		t.Fatal("the connection stays open after a stalled body")
	}
}
