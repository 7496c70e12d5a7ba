package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// hostileIdentities are identities a caller chooses (a check's key, a
// forward-auth user id) that the console shows in its top list.
var hostileIdentities = []string{
	`<img src=x onerror="window.__xss=1">`,
	`</script><script>window.__xss=2</script>`,
	`"><svg onload="window.__xss=3">`,
	`javascript:window.__xss=4`,
	`=HYPERLINK("http://evil.example","x")`,
	`*`,
}

// TestConsoleBrowserHostileIdentities: identities chosen by callers reach
// the operator's page in the top list and the look-up. In Chromium, none
// of them runs as script or becomes markup; and a listed identity that
// holds '*' (a caller named "*") cannot be made, by looking it up from the
// list and setting an override, into an override of the pattern "*",
// which would apply to every identity of the fleet: the page refuses and
// says why.
func TestConsoleBrowserHostileIdentities(t *testing.T) {
	ctx := browser(t)
	s := startService(t, svcOptions{config: consoleConfig})
	for _, id := range hostileIdentities {
		body, _ := json.Marshal(map[string]string{"policy": "b", "key": id})
		for range 3 { // b is 2/s on a clock that does not move: the third is denied
			s.check(t, string(body))
		}
	}
	run := browserRunner(ctx, t, 20*time.Second)
	eval := func(expr string) string {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		v, err := chromedp.Run(c, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return v
	}
	want, _ := json.Marshal(hostileIdentities)
	run("every hostile identity in the top list, as text", chromedp.Navigate(s.url+"/ui/"), poll(fmt.Sprintf(
		`(() => { const ids = [...document.querySelectorAll("#top tbody td.clickable")].map(td => td.textContent);
		   return %s.every(id => ids.includes(id)); })()`, want)))
	run("admin token",
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS("body.admin")),
	)
	// Each is looked up from the list: its overrides and peeks render.
	for i := range hostileIdentities {
		run(fmt.Sprintf("look up %q", hostileIdentities[i]), poll(fmt.Sprintf(
			`(() => { const td = [...document.querySelectorAll("#top tbody td.clickable")].find(td => td.textContent === %s[%d]);
			   if (!td) return false; td.click(); return document.querySelector("#lookup").dataset.identity === %[1]s[%[2]d]; })()`, want, i)),
			chromedp.WaitVisible(chromedp.CSS("#peek tbody tr")))
	}
	if got := eval(`String(window.__xss)`); got != "undefined" {
		t.Fatalf("a hostile identity ran as script: window.__xss = %s", got)
	}
	if got := eval(`String(document.querySelectorAll("main img, main script, main iframe, main a, main svg :not(polyline):not(path):not(text)").length)`); got != "0" {
		t.Fatalf("a hostile identity became markup: %s elements", got)
	}
	// The last one looked up is "*": setting an override for it is refused.
	run("set an override for *",
		chromedp.SetValue(chromedp.CSS("#ov-policy"), "b"),
		chromedp.SendKeys(chromedp.CSS("#ov-limit"), "1000/s"),
		chromedp.Click(chromedp.CSS(`#override-form button[type="submit"]`)),
		poll(`(() => { const m = document.querySelector("#lookup-msg").textContent; return m === "override set" || m.includes("pattern"); })()`),
	)
	if a := s.do(t, "GET", "/v1/overrides", "", bearer...); a.status != 200 || a.num("count") != 0 {
		t.Fatalf("the page set an override for a listed identity that holds '*': %s", a.raw)
	}
	if a := s.check(t, `{"policy":"b","key":"someone-else"}`); a.num("rate") != 2 {
		t.Fatalf("another identity's limit: %s", a.raw)
	}
	if msg := eval(`document.querySelector("#lookup-msg").textContent`); !strings.Contains(msg, "PUT /v1/overrides") {
		t.Fatalf("message: %q", msg)
	}
}

// TestConsoleBrowserUnderPrefix: the console served by a proxy under a
// path prefix (https://ops.example/sluice/ui/) sends the admin token only
// to sluice. The page called the overrides API at the absolute path
// /v1/overrides, so behind such a proxy its PUT and DELETE, with
// Authorization: Bearer and the admin token, went to whatever the proxy
// serves at the root of the origin.
func TestConsoleBrowserUnderPrefix(t *testing.T) {
	ctx := browser(t)
	s := startService(t, svcOptions{config: consoleConfig})
	target, err := url.Parse(s.url)
	if err != nil {
		t.Fatal(err)
	}
	var leaked atomic.Value // the Authorization header the origin's other service got
	mux := http.NewServeMux()
	mux.Handle("/sluice/", http.StripPrefix("/sluice", httputil.NewSingleHostReverseProxy(target)))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if a := r.Header.Get("Authorization"); a != "" {
			leaked.Store(r.Method + " " + r.URL.Path + ": " + a)
		}
		http.NotFound(w, r)
	})
	front := httptest.NewServer(mux)
	defer front.Close()
	run := browserRunner(ctx, t, 20*time.Second)
	run("load /sluice/ui/ with the admin token",
		chromedp.Navigate(front.URL+"/sluice/ui/"),
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS("body.admin")),
	)
	run("look up and set an override",
		chromedp.SendKeys(chromedp.CSS("#lookup-id"), "tenant:prefixed"),
		chromedp.Click(chromedp.CSS(`#lookup-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#peek tbody tr")),
		chromedp.SetValue(chromedp.CSS("#ov-policy"), "b"),
		chromedp.SendKeys(chromedp.CSS("#ov-limit"), "1000/s"),
		chromedp.Click(chromedp.CSS(`#override-form button[type="submit"]`)),
		poll(`(() => { const m = document.querySelector("#lookup-msg").textContent; return m !== "" && !m.startsWith("overrides on the memory store"); })()`),
	)
	if got := leaked.Load(); got != nil {
		t.Fatalf("the page sent the admin token to the origin's other service: %s", got)
	}
	if a := s.do(t, "GET", "/v1/overrides", "", bearer...); a.num("count") != 1 || !strings.Contains(a.raw, `"identity":"tenant:prefixed"`) {
		t.Fatalf("the override did not reach sluice: %s", a.raw)
	}
	run("remove it from the page",
		poll(`(() => { const b = document.querySelector("#lookup-overrides li button"); if (!b) return false; b.click(); return true; })()`),
		chromedp.Click(chromedp.CSS(".confirm .confirm-yes")),
		poll(`document.querySelector("#lookup-overrides li").textContent === "none"`),
	)
	if got := leaked.Load(); got != nil {
		t.Fatalf("the page sent the admin token to the origin's other service: %s", got)
	}
	if a := s.do(t, "GET", "/v1/overrides", "", bearer...); a.num("count") != 0 {
		t.Fatalf("the override was not removed: %s", a.raw)
	}
}

// TestConsoleBrowserLookupExact: an identity clicked in the top list is
// looked up, reset and given overrides as it is, byte for byte. The page
// put it in the look-up field and read the field back trimmed, so a
// caller keyed "tenant:victim " (a trailing space, invisible in the list)
// led the operator who clicked it to "tenant:victim", another caller:
// its state shown, its limit throttled. Such an identity shows quoted.
func TestConsoleBrowserLookupExact(t *testing.T) {
	ctx := browser(t)
	s := startService(t, svcOptions{config: consoleConfig})
	const victim, abuser = "tenant:victim", "tenant:victim "
	s.check(t, `{"policy":"b","key":"tenant:victim"}`)
	for range 3 {
		s.check(t, `{"policy":"b","key":"tenant:victim "}`)
	}
	run := browserRunner(ctx, t, 20*time.Second)
	run("admin token, and the abuser's entry clicked",
		chromedp.Navigate(s.url+"/ui/"),
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS("body.admin")),
		poll(`(() => { const td = document.querySelector("#top tbody td.clickable"); if (!td) return false; td.click(); return true; })()`),
		poll(`!!document.querySelector("#lookup").dataset.identity && document.querySelectorAll("#peek tbody tr").length > 0`),
	)
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err := chromedp.Run(c, chromedp.Evaluate[[]string](`[document.querySelector("#lookup").dataset.identity, document.querySelector("#top tbody td.clickable").textContent,
		[...document.querySelectorAll("#peek tbody tr td:nth-child(3)")].map(td => td.textContent).join(",")]`))
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != abuser {
		t.Fatalf("clicking %q looked up %q", abuser, got[0])
	}
	if got[1] != `"tenant:victim "` {
		t.Errorf("the list shows the abuser as %q, not quoted", got[1])
	}
	run("set an override from the look-up",
		chromedp.SetValue(chromedp.CSS("#ov-policy"), "b"),
		chromedp.SendKeys(chromedp.CSS("#ov-limit"), "1/s"),
		chromedp.Click(chromedp.CSS(`#override-form button[type="submit"]`)),
		poll(`document.querySelector("#lookup-msg").textContent === "override set"`),
	)
	if a := s.do(t, "GET", "/v1/overrides", "", bearer...); a.num("count") != 1 || !strings.Contains(a.raw, `"identity":"tenant:victim "`) {
		t.Fatalf("overrides: %s", a.raw)
	}
	if a := s.check(t, fmt.Sprintf(`{"policy":"b","key":%q}`, victim)); a.num("rate") != 2 {
		t.Fatalf("the victim's limit changed: %s", a.raw)
	}
}
