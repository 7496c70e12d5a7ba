package server

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// This file drives the console's views in a real headless Chromium
// (browser, in console_browser_test.go): the look-up, the confirmation of
// destructive actions, the overrides list, the fleet charts, the phone
// layout and the gateway's spend.

// evalIn evaluates expr in ctx's page, failing t on an error.
func evalIn[T any](ctx context.Context, t *testing.T, expr string) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// TestConsoleBrowserLookup: in Chromium, a look-up of an API key lists
// its tier's policies only, in human units ("3 per day"), with why each
// applies; a limited one's wait reads as a duration ("6s").
func TestConsoleBrowserLookup(t *testing.T) {
	ctx := browser(t)
	s := startService(t, svcOptions{config: consoleConfig})
	for range 11 {
		s.check(t, fmt.Sprintf(`{"api_key":%q}`, freeKey))
	}
	run := browserRunner(ctx, t, 20*time.Second)
	run("look up demo-pro", chromedp.Navigate(s.url+"/ui/"),
		chromedp.SendKeys(chromedp.CSS("#lookup-id"), "key_name:demo-pro"),
		chromedp.Click(chromedp.CSS(`#lookup-form button[type="submit"]`)),
		poll(`document.querySelectorAll("#peek tbody tr[data-policy]").length > 0`))
	rows := evalIn[[]string](ctx, t, `[...document.querySelectorAll("#peek tbody tr")].map(tr => [...tr.cells].map(td => td.textContent).join("|"))`)
	want := []string{"daily|3 per day|3|passes|–|tier pro", "pro|100 per minute|100|passes|–|tier pro"}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("demo-pro's look-up: %q, want %q", rows, want)
	}
	if got := evalIn[string](ctx, t, `document.querySelector("#peek-others").textContent`); got == "" {
		t.Error("the look-up does not say that other policies do not apply")
	}
	run("look up demo-free, limited", chromedp.SetValue(chromedp.CSS("#lookup-id"), "key_name:demo-free"),
		chromedp.Click(chromedp.CSS(`#lookup-form button[type="submit"]`)),
		poll(`!!document.querySelector('#peek tbody tr[data-policy="free"]')`))
	rows = evalIn[[]string](ctx, t, `[...document.querySelectorAll("#peek tbody tr")].map(tr => [...tr.cells].map(td => td.textContent).join("|"))`)
	if want := []string{"free|10 per minute|0|limited|6s|tier free"}; fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("demo-free's look-up: %q, want %q", rows, want)
	}
	if got := evalIn[string](ctx, t, `[...document.querySelectorAll("#policies tbody tr")].find(tr => tr.cells[0].textContent === "daily").cells[2].textContent`); got != "3 per day" {
		t.Errorf("the config's daily policy shows as %q", got)
	}
}

// TestConsoleBrowserConfirm: in Chromium, "Reset its state" and an
// override's "remove" each open a confirmation first: until its button
// is pressed nothing changes (Cancel leaves it all), then the reset and
// the removal happen.
func TestConsoleBrowserConfirm(t *testing.T) {
	ctx := browser(t)
	s := startService(t, svcOptions{config: consoleConfig})
	const check = `{"policy":"b","key":"tenant:confirm"}`
	for range 3 {
		s.check(t, check)
	}
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"tenant:confirm","policy":"a","limit":"9/s","reason":"load test"}`, bearer...); a.status != 201 {
		t.Fatal(a.raw)
	}
	limited := func() bool {
		t.Helper()
		return s.do(t, "GET", "/v1/status?policy=b&key=tenant:confirm", "").num("remaining") == 0
	}
	overrides := func() int64 { t.Helper(); return s.do(t, "GET", "/v1/overrides", "", bearer...).num("count") }
	run := browserRunner(ctx, t, 20*time.Second)
	run("admin token and look-up", chromedp.Navigate(s.url+"/ui/"),
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS("body.admin")),
		chromedp.SendKeys(chromedp.CSS("#lookup-id"), "tenant:confirm"),
		chromedp.Click(chromedp.CSS(`#lookup-form button[type="submit"]`)),
		poll(`!!document.querySelector('#peek tbody tr[data-policy="b"]') && !!document.querySelector("#lookup-overrides li button")`))
	run("reset asks first", chromedp.Click(chromedp.CSS("#reset")), chromedp.WaitVisible(chromedp.CSS(".confirm .confirm-yes")))
	if !limited() {
		t.Fatal("the reset happened before it was confirmed")
	}
	run("cancel", chromedp.Click(chromedp.CSS(".confirm .confirm-no")), poll(`!document.querySelector(".confirm")`))
	if !limited() {
		t.Fatal("a cancelled reset happened")
	}
	run("reset, confirmed", chromedp.Click(chromedp.CSS("#reset")), chromedp.Click(chromedp.CSS(".confirm .confirm-yes")),
		poll(`document.querySelector("#lookup-msg").textContent.startsWith("reset ")`))
	if limited() {
		t.Fatal("the confirmed reset did not happen")
	}
	run("remove asks first", chromedp.Click(chromedp.CSS("#lookup-overrides li button")), chromedp.WaitVisible(chromedp.CSS(".confirm .confirm-yes")))
	if n := overrides(); n != 1 {
		t.Fatalf("the override was removed before it was confirmed: %d left", n)
	}
	run("remove, confirmed", chromedp.Click(chromedp.CSS(".confirm .confirm-yes")),
		poll(`document.querySelector("#lookup-msg").textContent === "override removed"`))
	if n := overrides(); n != 0 {
		t.Fatalf("the confirmed removal did not happen: %d left", n)
	}
}

// TestConsoleBrowserOverridesList: in Chromium, with the admin token the
// page lists the overrides in force: one set in the page with a reason
// shows who set it, why and until when; one on an API key's identity
// shows by the key's name and a hash prefix, the whole hash nowhere in
// the page; one removed from the list (confirmed) is gone from the store.
func TestConsoleBrowserOverridesList(t *testing.T) {
	ctx := browser(t)
	s := startService(t, svcOptions{config: consoleConfig})
	hash := sluice.HashKey(freeKey)
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"key:`+hash+`","policy":"free","limit":"50/min"}`, bearer...); a.status != 201 {
		t.Fatal(a.raw)
	}
	run := browserRunner(ctx, t, 20*time.Second)
	run("without the token, no list", chromedp.Navigate(s.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#overrides-section .admin-hide")))
	run("admin token, the list", chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		poll(`document.querySelectorAll("#overrides tbody tr[data-identity]").length === 1`))
	run("set one with a reason", chromedp.SendKeys(chromedp.CSS("#lookup-id"), "tenant:listed"),
		chromedp.Click(chromedp.CSS(`#lookup-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#peek tbody tr")),
		chromedp.SetValue(chromedp.CSS("#ov-policy"), "b"),
		chromedp.SendKeys(chromedp.CSS("#ov-limit"), "20000/day"),
		chromedp.SendKeys(chromedp.CSS("#ov-ttl"), "2h"),
		chromedp.SendKeys(chromedp.CSS("#ov-reason"), "launch week"),
		chromedp.Click(chromedp.CSS(`#override-form button[type="submit"]`)),
		poll(`document.querySelectorAll("#overrides tbody tr[data-identity]").length === 2`))
	rows := evalIn[[]string](ctx, t, `[...document.querySelectorAll("#overrides tbody tr")].map(tr => [...tr.cells].slice(0, 5).map(td => td.textContent).join("|") + "|" + tr.cells[5].textContent.includes("(in 2h)"))`)
	want := []string{ // soonest to expire first
		"tenant:listed|b|20000 per day|SLUICE_ADMIN_TOKEN|launch week|true",
		"key_name:demo-free (key:" + hash[:12] + "…)|free|50 per minute|SLUICE_ADMIN_TOKEN|–|false",
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("the list: %q, want %q", rows, want)
	}
	if text := evalIn[string](ctx, t, `document.body.innerText`); strings.Contains(text, hash) {
		t.Error("the page shows an API key's whole hash")
	}
	run("remove, confirmed", chromedp.Click(chromedp.CSS(`#overrides tbody tr[data-identity="tenant:listed"] button`)),
		chromedp.Click(chromedp.CSS("#overrides .confirm .confirm-yes")),
		poll(`document.querySelectorAll("#overrides tbody tr[data-identity]").length === 1`))
	if a := s.do(t, "GET", "/v1/overrides", "", bearer...); a.num("count") != 1 || strings.Contains(a.raw, "tenant:listed") {
		t.Fatalf("after the removal: %s", a.raw)
	}
}

// TestConsoleBrowserFleetCharts: two replicas on one Redis, traffic on
// the second only. In Chromium, the first's console charts it (the
// fleet's counts from the store, not the replica's own), with a time axis
// of clock labels; the 24 h range reads the 24 h buckets and labels its
// axis too.
func TestConsoleBrowserFleetCharts(t *testing.T) {
	ctx := browser(t)
	srv := redistest.NewStandalone(t)
	cfg := redisConfig(srv.URL(), "fail_open") + "console: {enabled: true, sample_interval: 250ms, top_sample: 1, public_read: true}\n"
	a, b := startService(t, svcOptions{redis: true, config: cfg}), startService(t, svcOptions{redis: true, config: cfg})
	check := fmt.Sprintf(`{"policy":"b","key":%q}`, "user:"+redistest.Prefix(t))
	tctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(25 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-tk.C:
				req, _ := http.NewRequestWithContext(tctx, "POST", b.url+"/v1/check", strings.NewReader(check))
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		}
	})
	t.Cleanup(func() { stop(); wg.Wait() })
	run := browserRunner(ctx, t, 20*time.Second)
	const cur = `figure[data-series="b/-"] .current`
	run("replica a charts replica b's traffic", chromedp.Navigate(a.url+"/ui/"),
		poll(fmt.Sprintf(`(() => { const c = document.querySelector(%q); return !!c && parseFloat(c.dataset.decisions) > 10; })()`, cur)))
	ticks := func() []string {
		return evalIn[[]string](ctx, t, `[...document.querySelectorAll('figure[data-series="b/-"] text.tick')].map(e => e.textContent)`)
	}
	if got := ticks(); len(got) < 2 || !clockLabels(got) {
		t.Errorf("15 min axis labels: %q", got)
	}
	if got := evalIn[string](ctx, t, `document.querySelector("#interval").textContent`); !strings.Contains(got, "every replica") {
		t.Errorf("the charts do not say they are the fleet's: %q", got)
	}
	run("24 h", chromedp.Click(chromedp.CSS(`#ranges button[data-range="24h"]`)),
		poll(`document.querySelector("#charts").dataset.range === "24h" && !!document.querySelector('figure[data-series="b/-"] polyline.d')`))
	if got := ticks(); len(got) < 3 || !clockLabels(got) {
		t.Errorf("24 h axis labels: %q", got)
	}
}

// clockLabels reports whether every label reads as a time of day, HH:MM.
func clockLabels(labels []string) bool {
	for _, l := range labels {
		var h, m int
		if n, err := fmt.Sscanf(l, "%02d:%02d", &h, &m); n != 2 || err != nil || len(l) != 5 || h > 23 || m > 59 {
			return false
		}
	}
	return true
}

// overflowing lists the page's elements that reach past the viewport's
// right edge, or scroll sideways, as "tag#id.class".
const overflowing = `(() => {
  const w = document.documentElement.clientWidth, out = [];
  if (document.documentElement.scrollWidth > w) out.push("document " + document.documentElement.scrollWidth + " > " + w);
  for (const e of document.querySelectorAll("body *")) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.right > w + 0.5 || r.left < -0.5) out.push(e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + (e.className && typeof e.className === "string" ? "." + e.className.replace(/ /g, ".") : "") + " " + Math.round(r.left) + ".." + Math.round(r.right));
  }
  // A control squeezed into a column too narrow for its label wraps it
  // letter by letter ("re/mo/ve"): every button's label stays on one line.
  for (const b of document.querySelectorAll("button")) {
    const r = b.getBoundingClientRect();
    if (r.width > 0 && r.height > 2.2 * parseFloat(getComputedStyle(b).lineHeight || "20")) out.push("button " + JSON.stringify(b.textContent) + " wraps: " + Math.round(r.height) + "px high");
  }
  return out.slice(0, 20);
})()`

// TestConsoleBrowserPhone: in Chromium at a phone's 390 px width, with
// every view filled (admin, a look-up with overrides, the overrides list,
// the charts, the simulator, the gateway), nothing reaches past the right
// edge or scrolls the page sideways, and no button's label wraps.
func TestConsoleBrowserPhone(t *testing.T) {
	ctx := browser(t)
	s := startService(t, svcOptions{config: consoleConfig})
	for range 3 {
		s.check(t, `{"policy":"b","key":"tenant:a-rather-long-identity-of-a-phone-test@example.com"}`)
	}
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"tenant:a-rather-long-identity-of-a-phone-test@example.com","policy":"b","limit":"20000/day","ttl":"3h","reason":"a reason long enough to wrap on a phone's narrow screen"}`, bearer...); a.status != 201 {
		t.Fatal(a.raw)
	}
	run := browserRunner(ctx, t, 20*time.Second)
	run("the page at 390 px, every view filled",
		chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile),
		chromedp.Navigate(s.url+"/ui/"),
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		poll(`document.querySelectorAll("#overrides tbody tr[data-identity]").length === 1`),
		poll(`(() => { const td = document.querySelector("#top tbody td.clickable"); if (!td) return false; td.click(); return true; })()`),
		poll(`!!document.querySelector('#peek tbody tr[data-policy="b"]')`),
		chromedp.Click(chromedp.CSS(`#sim-form button[type="submit"]`)),
		poll(`!!document.querySelector("#sim-chart svg")`))
	run("the chart", poll(`!!document.querySelector('figure[data-series="b/-"]')`))
	shot := func(name string) {
		if dir := os.Getenv("SLUICE_UI_ARTIFACTS"); dir != "" {
			run("screenshot", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
				buf, err := chromedp.FullScreenshot(100)(ctx, tg)
				if err != nil {
					return err
				}
				return os.WriteFile(filepath.Join(dir, name), buf, 0o644)
			}))
		}
	}
	shot("phone.png")
	if got := evalIn[float64](ctx, t, `document.documentElement.clientWidth`); got != 390 {
		t.Fatalf("viewport %v px wide, want 390", got)
	}
	if got := evalIn[[]string](ctx, t, overflowing); len(got) > 0 {
		t.Errorf("at 390 px, overflowing or wrapped: %q", got)
	}
	run("the reset confirmation", chromedp.Click(chromedp.CSS("#reset")), chromedp.WaitVisible(chromedp.CSS(".confirm .confirm-yes")))
	if got := evalIn[[]string](ctx, t, overflowing); len(got) > 0 {
		t.Errorf("at 390 px, confirming, overflowing or wrapped: %q", got)
	}
	// The removal's confirmation opens inside the overrides list's card
	// (a cell laid out as a row), and in the look-up's list of overrides:
	// its buttons keep their labels whole ("re/m/ov/e" was the bug).
	for _, where := range []string{"#overrides tbody tr[data-identity] button", "#lookup-overrides li button"} {
		run("the removal's confirmation in "+where, chromedp.Click(chromedp.CSS(where)), chromedp.WaitVisible(chromedp.CSS(".confirm .confirm-yes")))
		if got := evalIn[[]string](ctx, t, overflowing); len(got) > 0 {
			t.Errorf("at 390 px, confirming a removal in %s, overflowing or wrapped: %q", where, got)
		}
		if got := evalIn[[]string](ctx, t, narrowButtons); len(got) > 0 {
			t.Errorf("at 390 px, confirming a removal in %s, buttons narrower than their label: %q", where, got)
		}
		shot("phone-remove-" + strings.Fields(where)[0][1:] + ".png")
		run("cancel", chromedp.Click(chromedp.CSS(".confirm .confirm-no")))
	}
}

// narrowButtons lists the visible buttons whose box is narrower than
// their label on one line (the label's scrollWidth, or the width of its
// text measured with the button's font): a squeezed button wraps its
// label, letter by letter at worst.
const narrowButtons = `(() => {
  const out = [], ctx = document.createElement("canvas").getContext("2d");
  for (const b of document.querySelectorAll("button")) {
    const r = b.getBoundingClientRect();
    if (r.width === 0) continue;
    const cs = getComputedStyle(b);
    ctx.font = cs.font;
    const pad = parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight) + parseFloat(cs.borderLeftWidth) + parseFloat(cs.borderRightWidth);
    const need = ctx.measureText(b.textContent.trim()).width + pad;
    if (r.width + 0.5 < need) out.push(JSON.stringify(b.textContent) + " " + Math.round(r.width) + "px < " + Math.round(need) + "px");
  }
  return out.slice(0, 20);
})()`

// TestConsoleBrowserSpend: in Chromium, with a gateway in the process and
// the admin token, the page shows the gateway's spend per key, team and
// org against their budgets: a request by alice spends on her key's, her
// team's and her org's budgets, each with a meter; bob's shows nothing
// spent; no key or key hash is on the page. At 390 px it fits.
func TestConsoleBrowserSpend(t *testing.T) {
	ctx := browser(t)
	s, gw := gatewayService(t)
	req, _ := http.NewRequest("POST", gw+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`))
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("a request through the gateway: %d", res.StatusCode)
	}
	run := browserRunner(ctx, t, 20*time.Second)
	run("without the token, no spend", chromedp.Navigate(s.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#spend-section .admin-hide")))
	run("admin token: the spend", chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		// The settlement follows the answer: the page refreshes until the
		// team's spend shows.
		poll(`(() => { const tr = document.querySelector('#spend tbody tr[data-level="team"]'); return !!tr && tr.cells[3].textContent !== "$0.000000"; })()`))
	// The spend is charted too, in dollars a minute.
	run("the spend chart", poll(`(() => { const f = document.querySelector('figure[data-series="gateway:spend/t"]'); return !!f && Number(f.dataset.decisions) > 0 && f.querySelector(".current").textContent.startsWith("$"); })()`))
	rows := evalIn[[]string](ctx, t, `[...document.querySelectorAll("#spend tbody tr")].map(tr => tr.dataset.level + " " + tr.dataset.name + "|" + tr.cells[2].textContent + "|" + (tr.cells[3].textContent !== "$0.000000") + "|" + !!tr.querySelector("meter"))`)
	want := []string{ // the largest share of its budget first: one request's cost on each
		"team research|$2.000000 per week|true|true",
		"key alice|$5.000000 per day|true|true",
		"org acme|$10.000000 per month|true|true",
		"key bob|$5.000000 per day|false|true",
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("spend rows: %q, want %q", rows, want)
	}
	text := evalIn[string](ctx, t, `document.body.innerText`)
	for _, secret := range []string{aliceKey, bobKey, sluice.HashKey(aliceKey)[:12]} {
		if strings.Contains(text, secret) {
			t.Fatalf("the page shows %q", secret)
		}
	}
	run("at 390 px", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Reload(),
		poll(`document.querySelectorAll('#spend tbody tr[data-level]').length === 4`))
	if got := evalIn[[]string](ctx, t, overflowing); len(got) > 0 {
		t.Errorf("at 390 px, overflowing or wrapped: %q", got)
	}
}

// TestConsoleBrowserUpstreams: in Chromium, with a pooled gateway in the
// process and the admin token, the page lists each upstream model with
// its declared limits and those in force (east's rpm learned), a meter per
// limit of what the store has left, what the provider reported, and its
// state: west, answering 429, cooling. No upstream key is on the page. At
// 390 px it fits.
func TestConsoleBrowserUpstreams(t *testing.T) {
	ctx := browser(t)
	s := poolService(t)
	run := browserRunner(ctx, t, 20*time.Second)
	run("without the token, no headroom", chromedp.Navigate(s.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#upstreams-section .admin-hide")))
	run("admin token: the headroom", chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		poll(`document.querySelectorAll('#upstreams tbody tr[data-upstream]').length === 2`))
	rows := evalIn[[]string](ctx, t, `[...document.querySelectorAll("#upstreams tbody tr")].map(tr => [tr.dataset.upstream, tr.dataset.model, tr.cells[2].textContent, tr.cells[3].textContent,
		[...tr.querySelectorAll("meter")].map(m => m.dataset.kind).join(","), tr.cells[5].textContent, tr.cells[6].textContent !== "–", tr.dataset.state].join("|"))`)
	want := []string{
		"east|gpt-test-e|rpm 100 · tpm 100000|rpm 50 · tpm 100000 (learned)|rpm,tpm|requests 48|false|up",
		"west|gpt-test-w|rpm 100|rpm 100|rpm|not reported|true|cooling",
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("upstream rows: %q, want %q", rows, want)
	}
	if v := evalIn[float64](ctx, t, `document.querySelector('#upstreams tr[data-upstream="west"] meter').value`); v != 0 {
		t.Errorf("west's rpm meter at %v, want 0 while cooling", v)
	}
	if v := evalIn[float64](ctx, t, `document.querySelector('#upstreams tr[data-upstream="east"] meter').value`); v < 0.9 || v > 0.97 {
		t.Errorf("east's rpm meter at %v, want about 48 of 50", v)
	}
	html := evalIn[string](ctx, t, `document.documentElement.outerHTML`)
	for _, secret := range []string{eastUpstreamKey, westUpstreamKey, eastUpstreamKey[:12], "SLUICE_TEST_EAST_KEY"} {
		if strings.Contains(html, secret) {
			t.Fatalf("the page shows %q", secret)
		}
	}
	run("at 390 px", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Reload(),
		poll(`document.querySelectorAll('#upstreams tbody tr[data-upstream]').length === 2`))
	if got := evalIn[[]string](ctx, t, overflowing); len(got) > 0 {
		t.Errorf("at 390 px, overflowing or wrapped: %q", got)
	}
	if dir := os.Getenv("SLUICE_UI_ARTIFACTS"); dir != "" {
		run("screenshot", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			buf, err := chromedp.Screenshot(chromedp.CSS("#upstreams-section"))(ctx, tg)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, "upstreams-phone.png"), buf, 0o644)
		}))
	}
}

// TestConsoleBrowserDisabled: in Chromium, /ui of a service without the
// console is a short page saying how to enable it, which fits at 1280 and
// 390 px.
func TestConsoleBrowserDisabled(t *testing.T) {
	ctx := browser(t)
	s := startService(t, svcOptions{})
	run := browserRunner(ctx, t, 20*time.Second)
	for _, w := range []struct {
		width, height int64
		opts          []chromedp.EmulateViewportOption
	}{{1280, 900, nil}, {390, 844, []chromedp.EmulateViewportOption{chromedp.EmulateMobile}}} {
		run(fmt.Sprintf("%d px", w.width), chromedp.EmulateViewport(w.width, w.height, w.opts...), chromedp.Navigate(s.url+"/ui"),
			chromedp.WaitVisible(chromedp.CSS("pre")))
		if text := evalIn[string](ctx, t, `document.body.innerText`); !strings.Contains(text, "console:\n  enabled: true") || !strings.Contains(text, "docs/API.md") {
			t.Fatalf("at %d px the page reads %q", w.width, text)
		}
		if got := evalIn[[]string](ctx, t, overflowing); len(got) > 0 {
			t.Errorf("at %d px, overflowing: %q", w.width, got)
		}
	}
}

// TestConsoleBrowserTopEstimated: in Chromium, a top-list count that was
// sampled shows as an estimate ("≈N"), and the page says how it was
// sampled; an exact one shows bare. With top_exact 1, an identity denied
// many times within a second is past it (98 denials: however a flush
// splits them, one side holds more than one), one denied once is not.
func TestConsoleBrowserTopEstimated(t *testing.T) {
	ctx := browser(t)
	s := startService(t, svcOptions{config: testConfig + "console: {enabled: true, sample_interval: 100ms, top_exact: 1, top_sample: 16, public_read: true}\n"})
	for range 100 {
		s.check(t, `{"policy":"b","key":"tenant:flood"}`)
	}
	for range 3 {
		s.check(t, `{"policy":"b","key":"tenant:once"}`)
	}
	run := browserRunner(ctx, t, 20*time.Second)
	run("the estimate", chromedp.Navigate(s.url+"/ui/"),
		poll(`(() => { const f = document.querySelector('#top tbody tr[data-identity="tenant:flood"] span.estimated'), o = document.querySelector('#top tbody tr[data-identity="tenant:once"] span.exact');
		   return !!f && f.textContent.startsWith("≈") && !!o && o.textContent === "1"; })()`))
	if note := evalIn[string](ctx, t, `document.querySelector("#top-note").textContent`); !strings.Contains(note, "past 1 denial of an identity") || !strings.Contains(note, "one in 16") {
		t.Errorf("the note on estimates reads %q", note)
	}
}

// TestConsoleBrowserRegions: in Chromium, the console of `sluice serve`
// in region us shows its regions to the admin only: eu reachable with its
// round trip, ap, cut off, unreachable; the global policy and its home;
// what decided this instance's global keys. It fits at 390 px.
func TestConsoleBrowserRegions(t *testing.T) {
	ctx := browser(t)
	s, w := regionsService(t)
	if a := s.check(t, `{"policy":"world","key":"c1"}`); a.status != 200 {
		t.Fatalf("check: %d %s", a.status, a.raw)
	}
	w.Links[[2]string{"us", "ap"}].Partition()
	run := browserRunner(ctx, t, 20*time.Second)
	run("without the token, no regions", chromedp.Navigate(s.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#regions-section .admin-hide")))
	if n := evalIn[int](ctx, t, `document.querySelectorAll('#regions tbody tr[data-region]').length`); n != 0 {
		t.Fatalf("%d region rows without the token", n)
	}
	run("admin token: the regions", chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		poll(`document.querySelectorAll('#regions tbody tr[data-region]').length === 2`))
	rows := evalIn[[]string](ctx, t, `[...document.querySelectorAll("#regions tbody tr")].map(tr => [tr.dataset.region, tr.dataset.reachable, tr.cells[2].textContent.endsWith(" ms")].join("|"))`)
	if want := []string{"ap|false|false", "eu|true|true"}; fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("region rows %q, want %q", rows, want)
	}
	if got := evalIn[string](ctx, t, `document.querySelector("#region-globals tbody").textContent`); got != "worldeu" {
		t.Errorf("global policies %q", got)
	}
	if got := evalIn[string](ctx, t, `document.querySelector("#region-counters").textContent`); !strings.Contains(got, "share 1") || !strings.Contains(got, "units held in") || !strings.Contains(got, "cut off from a home: fail_closed") {
		t.Errorf("counters %q", got)
	}
	run("at 390 px", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Reload(),
		poll(`document.querySelectorAll('#regions tbody tr[data-region]').length === 2`))
	if got := evalIn[[]string](ctx, t, overflowing); len(got) > 0 {
		t.Errorf("at 390 px, overflowing or wrapped: %q", got)
	}
}
