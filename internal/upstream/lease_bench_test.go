package upstream

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/yamlconf"
	"github.com/sluice-io/sluice/redisstore"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// BenchmarkPoolLease: admissions on one hot upstream model (rpm and tpm)
// on a real Redis, each settled, with leases (lease=on) and without
// (lease=off, the baseline: one script call per admission), in one run.
// It reports the store calls per admission and the time per admission.
func BenchmarkPoolLease(b *testing.B) {
	url := redistest.Standalone(b).URL()
	for _, lease := range []bool{false, true} {
		name := map[bool]string{false: "lease=off", true: "lease=on"}[lease]
		b.Run(name, func(b *testing.B) {
			st, err := redisstore.New(context.Background(), redisstore.Options{URL: url, Timeout: 5 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			cs := &countingStore{Store: st}
			up := "bench-" + map[bool]string{false: "off", true: "on"}[lease] + time.Now().Format("150405.000000")
			defs := []Def{{Name: up, Kind: OpenAI, BaseURL: "http://a.example/v1", KeyEnv: "A", Models: map[string]Limits{"m": {RPM: 1 << 36, TPM: 1 << 40}}}}
			routes := map[string][]Target{"m": {{Upstream: up, Model: "m"}}}
			r := Routing{Lease: &lease}
			doc := yamlconf.New(nil, "")
			Check(doc, defs, routes, &r)
			if err := doc.Err(); err != nil {
				b.Fatal(err)
			}
			p, err := New(Options{Upstreams: defs, Routes: routes, Routing: r, Store: cs, Getenv: func(string) string { return "sk" }})
			if err != nil {
				b.Fatal(err)
			}
			route := p.Route("m", "")
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				g, _, err := p.Acquire(ctx, route, false, 100, 200, nil)
				if err != nil || g == nil {
					b.Fatal("refused", err)
				}
				if _, err := g.Settle(ctx, 100, 50, false); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cs.calls.Load())/float64(b.N), "store-calls/op")
		})
	}
}
