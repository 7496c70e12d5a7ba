package guard_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
)

// A guard wraps any store; decisions stay exact while the store answers.
func Example() {
	ms, _ := memstore.New(memstore.Options{})
	g, err := guard.New(ms, guard.Options{Policy: guard.Local, Timeout: -1, CloseStore: true})
	if err != nil {
		panic(err)
	}
	defer g.Close()
	req := sluice.Request{Key: "user:42", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(2), Cost: 1}
	for range 3 {
		d, _ := g.Apply(context.Background(), sluice.OpAllow, req)
		fmt.Println(d.Allowed, d.Degraded)
	}
	// Output:
	// true false
	// true false
	// false false
}

// The usual setup: the Redis store, guarded with the Local policy. The
// store may be created while Redis is down; it connects when Redis
// appears, and the guard answers by the policy meanwhile.
func Example_redis() {
	ctx := context.Background()
	rs, err := redisstore.New(ctx, redisstore.Options{URL: "redis://127.0.0.1:6379"})
	if err != nil {
		panic(err) // a malformed URL, a wrong password, an untrusted certificate
	}
	store, err := guard.New(rs, guard.Options{Timeout: 50 * time.Millisecond, CloseStore: true})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	lim, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.PerMinute(600)})
	if err != nil {
		panic(err)
	}
	d, err := lim.Allow(ctx, "user:42")
	fmt.Println(d.Allowed, d.Degraded, d.Fallback, err)
}
