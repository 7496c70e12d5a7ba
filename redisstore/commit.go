package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// Group commit for the plain path's commands. A node is sent at most one
// group of them at a time: a command that finds its node idle goes at
// once, alone, as a direct call would; commands that arrive while a group
// is on its way wait for it to come back and then go together, in one
// write, which Redis reads in one go. So a lone caller waits for nothing,
// and under load a group holds what arrived during one round trip: the
// depth of the pipeline follows the load without a fixed delay. Redis's
// CPU per command falls steeply with the commands per read (the event
// loop's read, write and epoll calls are shared), and so does the
// client's: one write and one read per group instead of per command.

const (
	// maxGroup bounds the commands of one group; more wait for the next.
	maxGroup = 512
	// maxQueued bounds the commands waiting on one node; past it a
	// command goes on its own (rueidis pipelines it).
	maxQueued = 16 * maxGroup
	// maxCommitters bounds the nodes with a committer of their own
	// (a Cluster's masters, over the store's life); others send directly.
	maxCommitters = 1024
)

// committers are a store's committers, one per node.
type committers struct {
	m    atomic.Pointer[map[string]*committer] // copied on write, under mu
	mu   sync.Mutex
	stop chan struct{}
	wg   sync.WaitGroup
	pool sync.Pool // of *pending
}

// of returns node's committer, nil when there are too many.
func (cs *committers) of(node string, sender *Store) *committer {
	if m := cs.m.Load(); m != nil {
		if c := (*m)[node]; c != nil {
			return c
		}
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var old map[string]*committer
	if m := cs.m.Load(); m != nil {
		old = *m
	}
	if c := old[node]; c != nil {
		return c
	}
	if cs.stop == nil {
		cs.stop = make(chan struct{})
	}
	select {
	case <-cs.stop:
		return nil // closed
	default:
	}
	if len(old) >= maxCommitters {
		return nil
	}
	m := make(map[string]*committer, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	c := &committer{s: sender, pool: &cs.pool, kick: make(chan struct{}, 1)}
	m[node] = c
	cs.m.Store(&m)
	cs.wg.Add(1)
	go func() {
		defer cs.wg.Done()
		c.loop(cs.stop)
	}()
	return c
}

// close stops every committer; commands still waiting fail.
func (cs *committers) close() {
	cs.mu.Lock()
	if cs.stop == nil {
		cs.stop = make(chan struct{})
	}
	select {
	case <-cs.stop:
	default:
		close(cs.stop)
	}
	cs.mu.Unlock()
	cs.wg.Wait()
}

// committer sends one node's plain commands, one group at a time.
type committer struct {
	s     *Store
	pool  *sync.Pool
	mu    sync.Mutex
	busy  bool // a command or group is on its way to the node
	queue []*pending
	kick  chan struct{}
}

// pending is a command waiting for its group. done receives once, when
// res is set; a pending whose caller took its answer is used again.
type pending struct {
	cmd  rueidis.Completed
	res  rueidis.RedisResult
	done chan struct{}
}

// errClosed answers the commands that a closing store did not send.
var errClosed = fmt.Errorf("redisstore: %w: the store is closed", ErrUnavailable)

// do sends cmd to the node, at once when it is idle, else with the next
// group. It returns when the answer is in or ctx is done; a command whose
// caller left still runs (the plain path counts it: stricter).
func (c *committer) do(ctx context.Context, client rueidis.Client, cmd rueidis.Completed) rueidis.RedisResult {
	c.mu.Lock()
	if !c.busy {
		c.busy = true
		c.mu.Unlock()
		if h := c.s.commitHook; h != nil {
			h("direct", 1)
		}
		res := client.Do(ctx, cmd)
		c.release()
		return res
	}
	if len(c.queue) >= maxQueued {
		c.mu.Unlock()
		return client.Do(ctx, cmd)
	}
	p, _ := c.pool.Get().(*pending)
	if p == nil {
		p = &pending{done: make(chan struct{}, 1)}
	}
	p.cmd = cmd
	c.queue = append(c.queue, p)
	if h := c.s.commitHook; h != nil {
		h("queued", len(c.queue))
	}
	c.mu.Unlock()
	select {
	case <-p.done:
		res := p.res
		*p = pending{done: p.done}
		c.pool.Put(p)
		return res
	case <-ctx.Done():
		return rueidis.NewErrorResult(ctx.Err()) // p is dropped, not reused
	}
}

// release ends a direct send: the node is idle again, or the loop sends
// what queued meanwhile (and stays busy until the queue is empty).
func (c *committer) release() {
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.busy = false
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// loop sends the queued groups each time release hands it the node.
func (c *committer) loop(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			c.mu.Lock()
			q := c.queue
			c.queue = nil
			c.mu.Unlock()
			for _, p := range q {
				p.res = rueidis.NewErrorResult(errClosed)
				p.done <- struct{}{}
			}
			return
		case <-c.kick:
		}
		for {
			c.mu.Lock()
			n := min(len(c.queue), maxGroup)
			if n == 0 {
				c.busy = false
				c.mu.Unlock()
				break
			}
			group := make([]*pending, n)
			copy(group, c.queue)
			rest := copy(c.queue, c.queue[n:])
			clear(c.queue[rest:])
			c.queue = c.queue[:rest]
			c.mu.Unlock()
			c.sendGroup(group)
		}
	}
}

// sendGroup sends group in one DoMulti, bounded by the store's timeout,
// and hands each command its answer.
func (c *committer) sendGroup(group []*pending) {
	cmds := make([]rueidis.Completed, len(group))
	for i, p := range group {
		cmds[i] = p.cmd
	}
	if h := c.s.commitHook; h != nil {
		h("group", len(group))
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.s.timeout)
	defer cancel()
	var res []rueidis.RedisResult
	if client := c.s.client(); client != nil {
		res = client.DoMulti(ctx, cmds...)
	}
	for i, p := range group {
		if i < len(res) {
			p.res = res[i]
		} else {
			p.res = rueidis.NewErrorResult(c.s.notConnected())
		}
		p.done <- struct{}{}
	}
}

// groupOf returns the committer of key's node, or nil when commands go
// alone: when the store was built without group commit, or on a Cluster
// whose slots it does not know yet (a group must not wait on two nodes).
func (s *Store) groupOf(key string) *committer {
	if s.noGroupCommit || (s.cluster && s.slots.Load() == nil) {
		return nil
	}
	return s.commit.of(s.NodeOf(key), s)
}

// exec runs script on keys (which share a node) with EVALSHA through
// their node's group; a node that has lost the script (NOSCRIPT, after a
// restart or SCRIPT FLUSH) is sent it by rueidis, alone.
func (s *Store) exec(ctx context.Context, client rueidis.Client, script *rueidis.Lua, keys, args []string) rueidis.RedisResult {
	group := s.groupOf(keys[0])
	sha := s.scripts.sha[script]
	if group == nil || sha == "" {
		return script.Exec(ctx, client, keys, args)
	}
	res := group.do(ctx, client, client.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if err, ok := rueidis.IsRedisErr(res.Error()); ok && err.IsNoScript() {
		return script.Exec(ctx, client, keys, args)
	}
	return res
}

// plainDo sends cmd through c, or directly when c is nil.
func plainDo(ctx context.Context, client rueidis.Client, c *committer, cmd rueidis.Completed) rueidis.RedisResult {
	if c == nil {
		return client.Do(ctx, cmd)
	}
	return c.do(ctx, client, cmd)
}
