package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
)

// TestOutcomes: the console's hook gets one Outcome per metered request
// the gateway decides, on the request's path: admitted ones with the
// key's console name (gw_key:NAME, or gw_client:ID for a key without a
// name) and tier, and each 429 of its limits with the limit (the
// rejections metric's reason) and the wait it named. A request refused
// before any limit (no key) is no decision and not reported. LookUp
// finds a key by the same names, and no other.
func TestOutcomes(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	cfg, err := Parse("test.yaml", []byte(fmt.Sprintf(`
upstream: {base_url: %s/v1, allow_no_key: true}
tiers: {t: {rpm: 2, tpm: 1000}}
keys:
  - {name: alice, hash: %s, tier: t}
  - {hash: %s, tier: t, client: ci-runner}
`, up.URL(), sluice.HashKey(clientKey), sluice.HashKey(clientKey2))))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	gw, err := New(Options{Config: cfg, Store: fakeClockStore(t), OnOutcome: func(o Outcome) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s %s limited=%v %s wait=%v", o.Identity, o.Tier, o.Limited, o.Limit, o.RetryAfter > 0))
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	chat := func(key string, maxTokens int) int {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(fmt.Sprintf(`{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":%d}`, maxTokens)))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	codes := []int{chat(clientKey, 5), chat(clientKey, 5), chat(clientKey, 5), chat(clientKey, 5000), chat("", 5), chat(clientKey2, 5)}
	if fmt.Sprint(codes) != "[200 200 429 429 401 200]" {
		t.Fatalf("answers %v", codes)
	}
	// Every handler has returned (a 429's outcome is reported after its
	// answer is written), then every settlement.
	srv.Close()
	gw.Close()
	want := []string{
		"gw_key:alice t limited=false  wait=false",
		"gw_key:alice t limited=false  wait=false",
		"gw_key:alice t limited=true rpm wait=true",
		"gw_key:alice t limited=true too_large wait=false",
		"gw_client:ci-runner t limited=false  wait=false",
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("outcomes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	ctx := context.Background()
	st, err := gw.LookUp(ctx, "gw_key:alice")
	if err != nil || st.Tier != "t" || len(st.Limits) != 2 {
		t.Fatalf("look-up of alice: %+v %v", st, err)
	}
	for _, l := range st.Limits {
		if l.Name == "rpm" && l.Remaining != 0 {
			t.Errorf("alice's rpm: %d left, want 0", l.Remaining)
		}
	}
	if st, err := gw.LookUp(ctx, "gw_client:ci-runner"); err != nil || st.Tier != "t" {
		t.Fatalf("look-up of ci-runner: %+v %v", st, err)
	}
	for _, id := range []string{"gw_key:nobody", "alice", "key_name:alice", "gw_client:" + sluice.HashKey(clientKey)[:16]} {
		if _, err := gw.LookUp(ctx, id); !errors.Is(err, ErrNoKey) {
			t.Errorf("look-up of %q: %v, want ErrNoKey", id, err)
		}
	}
}
