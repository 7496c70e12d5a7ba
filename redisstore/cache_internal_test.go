package redisstore

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

func TestDenyCacheIsBounded(t *testing.T) {
	c := newDenyCache(100)
	lim := sluice.PerMinute(1)
	d := sluice.Decision{Limit: lim, RetryAfter: time.Minute, ResetAfter: time.Minute}
	for i := range 1000 {
		req := sluice.Request{Key: "k" + strconv.Itoa(i), Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
		c.put(&req, d, int64(i))
		if n := c.m.Size(); n > 100 {
			t.Fatalf("after %d puts the cache holds %d entries, over its bound of 100", i+1, n)
		}
	}
	// The newest denial is answered, with its times counted down.
	req := sluice.Request{Key: "k999", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	got, ok := c.get(&req, 999+int64(time.Second))
	if !ok || got.RetryAfter != time.Minute-time.Second || got.ResetAfter != time.Minute-time.Second {
		t.Fatalf("get = %+v, %v", got, ok)
	}
	// A lapsed denial is dropped, another limit or cost is not answered.
	if _, ok := c.get(&req, 999+int64(time.Minute)); ok {
		t.Fatal("lapsed denial answered")
	}
	req2 := sluice.Request{Key: "k998", Algorithm: sluice.GCRA, Limit: sluice.PerMinute(2), Cost: 1}
	if _, ok := c.get(&req2, 999); ok {
		t.Fatal("denial answered for another limit")
	}
	c.del("k997")
	if _, ok := c.m.Load("k997"); ok {
		t.Fatal("del left the entry")
	}
}
