package redisstore

import (
	"context"
	"testing"
	"time"
)

// A call's context is bounded by the store's timeout; one whose deadline
// comes first (the guard's) is kept as it is.
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
	for _, parent := range []context.Context{context.Background(), func() context.Context {
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
