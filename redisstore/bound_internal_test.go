package redisstore

import (
	"context"
	"testing"
	"time"
)

// A call's context is bounded by the store's timeout; one whose deadline
// comes first (the guard's) is kept as it is; context.Background gets a
// shared context, bounded by 9/8 of the timeout (deadline.go).
func TestBound(t *testing.T) {
	c := &core{timeout: time.Second}
	near, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	got, done := c.bound(near)
	done()
	if got != near {
		t.Fatal("a context with an earlier deadline was wrapped")
	}
	if near.Err() != nil {
		t.Fatal("the returned cancel cancelled the caller's context")
	}
	before := time.Now()
	shared, done := c.bound(context.Background())
	d, ok := shared.Deadline()
	if !ok || d.Before(before.Add(c.timeout)) || d.After(time.Now().Add(c.timeout+c.timeout/8)) {
		t.Fatalf("background: deadline %v, want the store's timeout from now (%v) to 9/8 of it", d, before.Add(c.timeout))
	}
	done()
	if shared.Err() != nil {
		t.Fatal("one call's cancel ended the context other calls share")
	}
	if again, _ := c.bound(context.TODO()); again != shared {
		t.Fatal("two calls at once without a deadline did not share a context")
	}
	for _, parent := range []context.Context{func() context.Context {
		far, cancel := context.WithTimeout(context.Background(), time.Hour)
		t.Cleanup(cancel)
		return far
	}()} {
		before := time.Now()
		got, done := c.bound(parent)
		d, ok := got.Deadline()
		if !ok || d.Before(before.Add(c.timeout)) || d.After(time.Now().Add(c.timeout)) {
			t.Fatalf("deadline %v, want the store's timeout from now (%v)", d, before.Add(c.timeout))
		}
		done()
		if got.Err() == nil {
			t.Fatal("cancel did not end the store's context")
		}
	}
}
