package server

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// floodConfig: a used-up 5/day key of every algorithm a policy may use,
// and flood policies of several algorithms, in a memory store of 1,000
// keys.
const floodConfig = `
store: {url: memory, max_keys: 1000}
policies:
  v_gcra: {limit: 5/day}
  v_token_bucket: {algorithm: token_bucket, limit: 5/day}
  v_fixed_window: {algorithm: fixed_window, limit: 5/day}
  v_sliding_window_counter: {algorithm: sliding_window_counter, limit: 5/day}
  v_sliding_window_log: {algorithm: sliding_window_log, limit: 5/day}
  f_token_bucket: {algorithm: token_bucket, limit: 10/min}
  f_gcra: {limit: 10/min}
  f_fixed_window: {algorithm: fixed_window, limit: 10/min}
  f_sliding_window_counter: {algorithm: sliding_window_counter, limit: 10/min}
`

var floodVictims = []string{"v_gcra", "v_token_bucket", "v_fixed_window", "v_sliding_window_counter", "v_sliding_window_log"}

// TestKeyFloodSparesUsedUpKeys is the red team's run through /v1/check:
// with the memory store bounded, a used-up 5/day key of each algorithm,
// then 8,000 distinct keys (eight times max_keys) of one policy, token
// bucket (the red team's) or GCRA. Every used-up key is still denied after
// it. Before eviction ranked keys across algorithms, each family lost the
// same share of its keys: the GCRA key, alone in its family, was evicted
// by the token-bucket flood, and a window's by the GCRA flood.
func TestKeyFloodSparesUsedUpKeys(t *testing.T) {
	for _, flood := range []string{"f_token_bucket", "f_gcra"} {
		t.Run(flood, func(t *testing.T) {
			s := startService(t, svcOptions{config: floodConfig})
			for _, p := range floodVictims {
				body := fmt.Sprintf(`{"policy":%q,"key":"victim"}`, p)
				for i := range 5 {
					if a := s.check(t, body); a.status != 200 {
						t.Fatalf("%s: charge %d: %d %s", p, i+1, a.status, a.raw)
					}
				}
				if a := s.check(t, body); a.status != 429 {
					t.Fatalf("%s: not used up: %d %s", p, a.status, a.raw)
				}
			}
			const batches, perBatch = 500, 16
			for b := range batches {
				s.clk.Advance(time.Millisecond)
				checks := make([]string, perBatch)
				for i := range checks {
					checks[i] = fmt.Sprintf(`{"policy":%q,"key":"flood-%d-%d"}`, flood, b, i)
				}
				if a := s.check(t, `{"checks":[`+strings.Join(checks, ",")+`]}`); a.status != 200 {
					t.Fatalf("flood batch %d: %d %s", b, a.status, a.raw)
				}
			}
			if n := s.store.(interface{ Len() int }).Len(); n > 1000 {
				t.Errorf("the store holds %d keys, over max_keys 1000", n)
			}
			for _, p := range floodVictims {
				if a := s.check(t, fmt.Sprintf(`{"policy":%q,"key":"victim"}`, p)); a.status != 429 {
					t.Errorf("%s: the used-up key was admitted again after %d fresh keys: evicted (%d %s)", p, batches*perBatch, a.status, a.raw)
				}
			}
		})
	}
}
