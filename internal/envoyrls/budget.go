package envoyrls

import (
	"container/list"
	"context"
	"sync"
)

// workBudget is a weighted semaphore whose waiters are served first come,
// first served: a call that needs more than is free waits, and so does
// every call behind it, so a peer's heavy call is not starved by its
// light ones (the algorithm of golang.org/x/sync/semaphore).
type workBudget struct {
	mu      sync.Mutex
	size    int64
	used    int64
	waiters list.List // of *budgetWaiter, in arrival order
}

type budgetWaiter struct {
	n     int64
	ready chan struct{} // closed when n is taken for it
}

func newWorkBudget(size int64) *workBudget { return &workBudget{size: size} }

// acquire takes n (at most the size), waiting its turn. It returns
// ctx's error, having taken nothing, if ctx ends first.
func (b *workBudget) acquire(ctx context.Context, n int64) error {
	b.mu.Lock()
	if b.size-b.used >= n && b.waiters.Len() == 0 {
		b.used += n
		b.mu.Unlock()
		return nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	elem := b.waiters.PushBack(w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // taken for it meanwhile: give it back
		b.used -= n
	default:
		b.waiters.Remove(elem)
	}
	b.grant() // whoever waited behind it may go now
	return ctx.Err()
}

// release gives back n taken by acquire.
func (b *workBudget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	b.grant()
}

// grant serves the waiters in order while what is free covers the first.
// b.mu is held.
func (b *workBudget) grant() {
	for e := b.waiters.Front(); e != nil; e = b.waiters.Front() {
		w := e.Value.(*budgetWaiter)
		if b.size-b.used < w.n {
			return
		}
		b.used += w.n
		b.waiters.Remove(e)
		close(w.ready)
	}
}
