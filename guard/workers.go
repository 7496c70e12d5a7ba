package guard

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/sluice-io/sluice"
)

// Store calls run on worker goroutines (see bounded) so that a caller can
// return at its deadline whatever the call is doing. A new goroutine per
// call grew its stack again on every call (the store path is deep): at 64
// calls in flight on Redis that copying, the goroutine's start and its
// scheduling were a tenth of the Envoy service's CPU. Workers instead wait
// for the next call once one is done, keeping the stack they grew, as
// gRPC's stream workers do. A call that finds no worker idle starts one;
// when more than maxWorkers are running, a worker whose call is done ends,
// so a stall that piled calls up does not keep their goroutines.

// maxWorkers bounds the workers that stay up waiting for calls.
func maxWorkers() int64 { return int64(max(64, 16*runtime.GOMAXPROCS(0))) }

// workers hands calls to idle worker goroutines.
type workers struct {
	work    chan *job
	running atomic.Int64
	max     int64
	stop    <-chan struct{}
	// jobs keeps the jobs whose callers received their results, with their
	// channels and request buffers, for the next calls: three allocations
	// a call fewer.
	jobs sync.Pool
}

func newWorkers(stop <-chan struct{}) *workers {
	return &workers{work: make(chan *job), max: maxWorkers(), stop: stop}
}

// job is one store call and where its result goes.
type job struct {
	g    *Guard
	ctx  context.Context
	op   sluice.Op
	reqs []sluice.Request
	one  bool
	done chan result
}

type result struct {
	ds  []sluice.Decision
	err error
}

// job returns a job to fill, with its done channel empty.
func (w *workers) job() *job {
	if j, ok := w.jobs.Get().(*job); ok {
		return j
	}
	return &job{done: make(chan result, 1)}
}

// done gives back j once its caller received its result from j.done:
// the worker sent it last, and touches j no more.
func (w *workers) done(j *job) {
	clear(j.reqs) // hold no caller's keys while pooled
	j.ctx = nil
	w.jobs.Put(j)
}

// run hands j to an idle worker, or starts one.
func (w *workers) run(j *job) {
	select {
	case w.work <- j:
	default:
		w.running.Add(1)
		go w.loop(j)
	}
}

func (w *workers) loop(j *job) {
	for {
		var ds []sluice.Decision
		err := j.ctx.Err()
		if err == nil { // a call picked up past its deadline is not sent: its caller was answered
			ds, err = j.g.call(j.ctx, j.op, j.reqs, j.one)
		}
		j.done <- result{ds, err} // buffered: the caller may be gone
		j = nil                   // hold no caller's context or requests while idle
		if w.running.Load() > w.max {
			w.running.Add(-1)
			return
		}
		select {
		case j = <-w.work:
		case <-w.stop:
			w.running.Add(-1)
			return
		}
	}
}
