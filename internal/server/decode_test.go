package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/ratelimittest"
)

// slowDecode is what decode does when decodeCheckFast declines.
func slowDecode(b []byte) (checkBody, bool) {
	var body checkBody
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return body, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return body, false
	}
	return body, true
}

func sameBody(a, b checkBody) bool {
	if a.Policy != b.Policy || a.Tier != b.Tier || a.Key != b.Key || a.APIKey != b.APIKey || len(a.Checks) != len(b.Checks) {
		return false
	}
	if (a.Cost == nil) != (b.Cost == nil) {
		return false
	}
	return a.Cost == nil || *a.Cost == *b.Cost
}

var decodeSeeds = []string{
	`{"policy":"free","key":"k"}`, ` { "tier" : "pro" , "key":"k", "cost" : 3 } `, `{"api_key":"sk-free-demo-0001"}`,
	`{}`, `{"cost":-1,"key":"k"}`, `{"cost":0}`, `{"cost":-0}`, `{"cost":01}`, `{"cost":1.5}`, `{"cost":1e3}`,
	`{"cost":999999999999999999}`, `{"cost":9999999999999999999}`, `{"key":"k","key":"l"}`, `{"Key":"k"}`,
	`{"key":"\u00e9"}`, `{"key":"é"}`, "{\"key\":\"\xff\"}", `{"key":null}`, `{"key":"k",}`, `{"key":"k"} x`,
	`{"key":"k"}{}`, `{"checks":[{"policy":"a","key":"x"}]}`, `{"polcy":"x"}`, "{\"key\":\"a\tb\"}", `[]`, `null`, ``,
	`{"key":"k"`, `{"key" "k"}`, `{"cost":-}`, `{"cost":"1"}`, `{"key":1}`,
}

// TestDecodeFast holds decodeCheckFast to encoding/json: whatever it
// accepts, encoding/json accepts with the same result.
func TestDecodeFast(t *testing.T) {
	accepted := 0
	for _, s := range decodeSeeds {
		var fast checkBody
		if !decodeCheckFast([]byte(s), &fast) {
			continue
		}
		accepted++
		slow, ok := slowDecode([]byte(s))
		if !ok || !sameBody(fast, slow) {
			t.Errorf("%q: fast %+v, encoding/json %+v (ok %v)", s, fast, slow, ok)
		}
	}
	if accepted < 8 {
		t.Errorf("the fast path took only %d of the seeds", accepted)
	}
}

// FuzzDecodeFast is the same comparison on arbitrary bodies.
func FuzzDecodeFast(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var fast checkBody
		if !decodeCheckFast([]byte(s), &fast) {
			return
		}
		slow, ok := slowDecode([]byte(s))
		if !ok || !sameBody(fast, slow) {
			t.Fatalf("%q: fast %+v, encoding/json %+v (ok %v)", s, fast, slow, ok)
		}
	})
}

// TestDecisionHeaders holds setDecisionHeaders to httplimit.SetHeaders for
// the enforced policies, and checks the result against the draft.
func TestDecisionHeaders(t *testing.T) {
	ds := []sluice.Decision{
		{Allowed: true, Limit: sluice.PerSecond(10), Remaining: 9},
		{Allowed: false, Limit: sluice.PerMinute(100), Remaining: 0, RetryAfter: 1500 * time.Millisecond, ResetAfter: 59 * time.Second},
		{Allowed: false, Limit: sluice.PerHour(5), Remaining: -2, RetryAfter: 0, ResetAfter: time.Hour},
		{Allowed: true, Limit: sluice.Limit{Rate: 3, Burst: 7, Period: 2500 * time.Millisecond}, Remaining: 6, ResetAfter: time.Millisecond},
	}
	for _, name := range []string{"free", "", `a"b`, "é"} {
		for i := range ds {
			for _, shadow := range []bool{false, true} {
				res := &outcome{
					targets: []target{
						{policy: &config.Policy{Name: name}, req: sluice.Request{Algorithm: sluice.GCRA}},
						{policy: &config.Policy{Name: name + "-2", Shadow: shadow}, req: sluice.Request{Algorithm: sluice.FixedWindow}},
					},
					decisions: []sluice.Decision{ds[i], ds[(i+1)%len(ds)]},
				}
				var qs []httplimit.Quota
				for j, tg := range res.targets {
					if !tg.policy.Shadow {
						qs = append(qs, httplimit.Quota{Name: tg.policy.Name, Algorithm: tg.req.Algorithm, Decision: res.decisions[j]})
					}
				}
				want := http.Header{}
				httplimit.SetHeaders(want, qs)
				want["Content-Type"] = []string{"application/json"}
				want["Content-Length"] = []string{"123"}
				got := http.Header{}
				setDecisionHeaders(got, res, 123)
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%q %d shadow %v:\n got %v\nwant %v", name, i, shadow, got, want)
				}
				ratelimittest.Check(t, got)
			}
		}
	}
}
