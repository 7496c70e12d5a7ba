package server

import (
	"strings"
	"testing"
)

// TestJSONNotHTMLEscaped: error bodies and the admin API's JSON show <, >
// and & as written, never as \u003c, \u003e, \u0026 (issue 27), and go
// with nosniff, so that no browser renders them as HTML.
func TestJSONNotHTMLEscaped(t *testing.T) {
	svc := startService(t, svcOptions{})
	a := svc.do(t, "POST", "/v1/check", `{"policy":"<none>&","key":"k"}`)
	if a.status != 400 || !strings.Contains(a.raw, `<none>&`) || strings.Contains(a.raw, `\u003c`) || strings.Contains(a.raw, `\u0026`) {
		t.Errorf("error body: %d %s", a.status, a.raw)
	}
	if a.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("error body without nosniff: %v", a.header)
	}
	b, err := marshalJSON(map[string]string{"reason": "a <b> & c"})
	if err != nil || string(b) != `{"reason":"a <b> & c"}`+"\n" {
		t.Errorf("marshalJSON: %s %v", b, err)
	}
}
