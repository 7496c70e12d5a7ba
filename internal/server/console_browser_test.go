package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/redistest"
)

// The browser test drives the console in a real headless Chromium. It
// needs /usr/bin/chromium (Debian's chromium; .ci/run installs it) or the
// browser named by SLUICE_CHROMIUM, and skips, saying why, only when none
// can start. Screenshots go to SLUICE_UI_ARTIFACTS when set (kept), or to
// a directory under the test's TempDir (removed with it).

// chromiumPath finds the browser.
func chromiumPath() (string, error) {
	if p := os.Getenv("SLUICE_CHROMIUM"); p != "" {
		return p, nil
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no chromium found (apt-get install chromium, or set SLUICE_CHROMIUM)")
}

// browser starts a headless Chromium with the flags this sandbox needs: no
// background networking (the network is closed), a fresh profile; extra
// adds flags of a test's own.
func browser(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	path, err := chromiumPath()
	if err != nil {
		t.Skipf("browser test skipped: %v", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	opts = append(opts, extra...)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelB(); cancelA() })
	// The first call starts the browser, for the context's lifetime: no
	// timeout on it (a timeout would stop the browser with it).
	if err := chromedp.Do(ctx); err != nil {
		t.Skipf("browser test skipped: chromium at %s cannot start: %v", path, err)
	}
	return ctx
}

func artifactsDir(t *testing.T) string {
	dir := os.Getenv("SLUICE_UI_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(t.TempDir(), "screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// TestConsoleBrowser: two replicas on one Redis, traffic on the first,
// which runs the AI gateway too. In Chromium, the console of the first
// shows its chart moving and the limited identity in the fleet's top
// list; an override set through the page (with the admin token) changes
// the next decision on the second replica within 1 s. The gateway's 429s
// show as serve's do: its key by name in the top list with the exact
// count and the limit, its tier's chart with every request and denial,
// and a look-up of its key with the tier's limits (and no override form:
// overrides do not apply to the gateway). At 1280 and 390 px nothing
// reaches past the right edge and no button is narrower than its label.
func TestConsoleBrowser(t *testing.T) {
	ctx := browser(t)
	shots := artifactsDir(t)
	srv := redistest.NewStandalone(t)
	up := fakeopenai.New(t, fakeopenai.Options{})
	cfg := redisConfig(srv.URL(), "fail_open") + "console: {enabled: true, sample_interval: 250ms, top_sample: 1}\n" + limitedGateway(up.URL())
	stored := &auditTimes{at: make(chan time.Time, 4)}
	a, gw := gatewayServiceWith(t, svcOptions{redis: true, config: cfg, log: stored})
	b := startService(t, svcOptions{redis: true, config: cfg})
	user := "user:" + redistest.Prefix(t)
	check := fmt.Sprintf(`{"policy":"b","key":%q}`, user)

	// Traffic: policy b (2/s) for one identity, about 40 requests a second.
	tctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(25 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-tk.C:
				req, _ := http.NewRequestWithContext(tctx, "POST", a.url+"/v1/check", strings.NewReader(check))
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		}
	}()
	t.Cleanup(func() { stop(); wg.Wait() })

	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			buf, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(shots, name), buf, 0o644)
		})
	}
	run := func(what string, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := chromedp.Do(c, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	points := func() string {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		v, err := chromedp.Run(c, chromedp.AttributeValue(chromedp.CSS(`figure[data-series="b/-"] polyline.d`), "points"))
		if err != nil {
			t.Fatalf("chart line: %v", err)
		}
		return v.Value
	}
	chartSel := `figure[data-series="b/-"] polyline.d`
	// The data takes an admin session: sign in on the page, then forget
	// the token (sessionStorage) and reload: the charts load with the
	// session's cookie alone, which the page's scripts cannot read.
	run("sign in", 15*time.Second,
		chromedp.Navigate(a.url+"/ui/"),
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS("body.admin")),
	)
	if js := evalIn[string](ctx, t, `sessionStorage.clear(), document.cookie`); strings.Contains(js, sessionCookie) {
		t.Fatalf("the page's scripts read the session cookie: %q", js)
	}
	run("load /ui with the session alone and see the chart", 15*time.Second,
		chromedp.Navigate(a.url+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(chartSel)),
	)
	before := points()
	// The chart moves: its line changes as points arrive, and the current
	// rate is above zero.
	run("the chart moves", 15*time.Second, poll(fmt.Sprintf(
		`(() => { const p = document.querySelector(%q); const c = document.querySelector('figure[data-series="b/-"] .current');
		   return !!(p && p.getAttribute("points") !== %q && c && parseFloat(c.dataset.decisions) > 0); })()`, chartSel, before)),
		shot("1-chart.png"))
	if after := points(); before == after {
		t.Fatal("the chart did not move")
	}
	// The limited identity is in the fleet's top list.
	run("the top list", 15*time.Second, poll(fmt.Sprintf(
		`[...document.querySelectorAll("#top tbody td.clickable")].some(td => td.textContent === %q)`, user)),
		shot("2-top.png"))
	// With the admin token, look it up from the list and set an override.
	run("admin token", 10*time.Second,
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS("body.admin")),
	)
	run("look up from the top list", 10*time.Second,
		// Found and clicked in one script: the list re-renders as it
		// refreshes, so a node looked up first may be gone by the click.
		poll(fmt.Sprintf(`(() => { const td = [...document.querySelectorAll("#top tbody td.clickable")].find(td => td.textContent === %q);
		   if (!td) return false; td.click(); return true; })()`, user)),
		chromedp.WaitVisible(chromedp.CSS("#peek tbody tr")),
		chromedp.SetValue(chromedp.CSS("#ov-policy"), "b"),
		chromedp.SendKeys(chromedp.CSS("#ov-limit"), "1000/s"),
		chromedp.SendKeys(chromedp.CSS("#ov-ttl"), "10m"),
	)
	// The next decision on the other replica uses it within 1 s of the
	// first replica storing it (its audit line): checks on the other
	// replica from the click on, the first to see the new limit sent
	// within that second. The browser's own time (click to PUT) is logged.
	clicked := time.Now()
	type seen struct{ at time.Time }
	applied, done := make(chan seen, 1), make(chan struct{})
	go func() {
		defer close(done)
		for time.Since(clicked) < 20*time.Second {
			sent := time.Now()
			if rate, err := checkRate(b.url, check); err == nil && rate == 1000 {
				applied <- seen{sent}
				return
			}
			time.Sleep(10 * time.Millisecond) // the rhythm of a client's checks, timed each: when one first saw the change
		}
		applied <- seen{}
	}()
	defer func() { <-done }()
	run("set the override", 20*time.Second,
		chromedp.Click(chromedp.CSS(`#override-form button[type="submit"]`)),
		poll(`document.querySelector("#lookup-msg").textContent === "override set"`),
	)
	var storedAt time.Time
	select {
	case storedAt = <-stored.at:
	case <-time.After(10 * time.Second):
		t.Fatal("no audit line for the override")
	}
	got := <-applied
	switch {
	case got.at.IsZero():
		t.Fatal("the other replica never applied the override")
	case got.at.Sub(storedAt) > time.Second:
		t.Fatalf("the other replica applied the override %s after the first stored it", got.at.Sub(storedAt))
	}
	t.Logf("the override set in the page: stored %s after the click, applied on the other replica by a check sent %s after it was stored",
		storedAt.Sub(clicked), max(0, got.at.Sub(storedAt)))
	run("screenshot", 10*time.Second, shot("3-override.png"))

	// Gateway traffic: carol's tier allows 2 requests a minute; 7 of
	// them make 5 of its 429s. Her key shows by name, with the exact
	// count and the limit that denied her.
	var codes []int
	for range 7 {
		codes = append(codes, gatewayChat(t, gw, carolKey))
	}
	if fmt.Sprint(codes) != "[200 200 429 429 429 429 429]" {
		t.Fatalf("gateway answers %v", codes)
	}
	carol := `#top tbody tr[data-identity="gw_key:carol"][data-policy="gateway:rpm"]`
	run("the gateway's 429s in the top list", 15*time.Second, poll(fmt.Sprintf(
		`(() => { const tr = document.querySelector(%q); return !!tr && tr.cells[2].textContent === "5"; })()`, carol)))
	run("the gateway's chart", 15*time.Second, poll(
		`(() => { const f = document.querySelector('figure[data-series="gateway:requests/small"]'); return !!f && f.dataset.decisions === "7" && f.dataset.denials === "5"; })()`),
		shot("5-gateway.png"))
	run("look up the gateway key from the top list", 10*time.Second,
		poll(fmt.Sprintf(`(() => { const tr = document.querySelector(%q); if (!tr) return false; tr.cells[0].click(); return true; })()`, carol)),
		poll(`(() => { const tr = document.querySelector('#peek tbody tr[data-policy="gateway:rpm"]'); return !!tr && tr.cells[2].textContent === "0" && tr.cells[3].textContent === "limited"; })()`))
	if got := evalIn[bool](ctx, t, `document.querySelector("#override-form").offsetParent === null && document.querySelector("#reset").offsetParent === null`); !got {
		t.Error("the override form and the reset show for a gateway key")
	}
	if text := evalIn[string](ctx, t, `document.body.innerText`); strings.Contains(text, carolKey) || strings.Contains(text, sluice.HashKey(carolKey)[:16]) {
		t.Fatal("the page shows carol's key or its hash")
	}
	for _, w := range []struct {
		width, height int64
		opts          []chromedp.EmulateViewportOption
	}{{1280, 900, nil}, {390, 844, []chromedp.EmulateViewportOption{chromedp.EmulateMobile}}} {
		name := fmt.Sprintf("%d px", w.width)
		run(name, 10*time.Second, chromedp.EmulateViewport(w.width, w.height, w.opts...), chromedp.Reload(),
			poll(fmt.Sprintf(`!!document.querySelector(%q)`, carol)),
			poll(`!!document.querySelector('figure[data-series="gateway:requests/small"]')`),
			shot(fmt.Sprintf("6-%dpx.png", w.width)))
		if got := evalIn[[]string](ctx, t, overflowing); len(got) > 0 {
			t.Errorf("at %s, overflowing or wrapped: %q", name, got)
		}
		if got := evalIn[[]string](ctx, t, narrowButtons); len(got) > 0 {
			t.Errorf("at %s, buttons narrower than their label: %q", name, got)
		}
	}
}

// checkRate sends a /v1/check and returns the rate of its answer; it is
// safe off the test's goroutine.
func checkRate(url, body string) (int64, error) {
	resp, err := http.Post(url+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var d struct {
		Rate int64 `json:"rate"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	return d.Rate, nil
}

// auditTimes is a log writer that notes when an override was stored.
type auditTimes struct{ at chan time.Time }

func (a *auditTimes) Write(p []byte) (int, error) {
	if strings.Contains(string(p), "override put") {
		select {
		case a.at <- time.Now():
		default:
		}
	}
	return len(p), nil
}

// poll waits until the JavaScript expression expr is true in the page.
func poll(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[bool](expr)(ctx, tg)
		return err
	})
}

// browserRunner returns a function that runs actions in ctx's browser,
// each run within timeout, failing t with what on an error.
func browserRunner(ctx context.Context, t *testing.T, timeout time.Duration) func(what string, actions ...chromedp.Action[chromedp.Void]) {
	return func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := chromedp.Do(c, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}
