package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
)

// Group commit for the commands of decisions (script calls and the plain
// path's). A node has at most commitLanes sends on their way at a time: a
// command that finds a lane free goes at once, alone, as a direct call
// would; commands that arrive while every lane is busy wait for one to
// come back and then go together, in one write, which Redis reads in one
// go. So a lone caller waits for nothing, and under load a group holds
// what arrived during a round trip: the depth of the pipeline follows the
// load without a fixed delay. Redis's
// CPU per command falls steeply with the commands per read (the event
// loop's read, write and epoll calls are shared), and so does the
// client's: one write and one read per group instead of per command.

const (
	// maxGroup bounds the commands of one group; more wait for the next.
	maxGroup = 512
	// maxQueued bounds the commands waiting on one node; past it a
	// command goes on its own (rueidis pipelines it).
	maxQueued = 16 * maxGroup
	// commitLanes is how many sends (a command alone or a group) a node
	// may have on their way at a time. With one, the node idles while a
	// group's answer travels back and the next group leaves, which cost a
	// client at full speed a quarter of its throughput; with two, one
	// group is read while the next gathers.
	commitLanes = 2
	// maxCommitters bounds the nodes with a committer of their own
	// (a Cluster's masters, over the store's life); others send directly.
	maxCommitters = 1024
)

// committers are a store's committers, one per node.
type committers struct {
	nodes  nodeMap[committer]
	closed atomic.Bool
	pool   sync.Pool // of *pending
	// groups and grouped count the groups sent and their commands;
	// gathered, the gcra_fast.lua calls sent within calls of several keys.
	groups, grouped, gathered atomic.Uint64
}

// of returns node's committer, nil when there are too many or the store
// is closed.
func (cs *committers) of(node string, sender *Store) *committer {
	return cs.nodes.getOrAdd(node, func(count int) *committer {
		if cs.closed.Load() || count >= maxCommitters {
			return nil
		}
		return &committer{s: sender, cs: cs}
	})
}

// close stops the committers: the commands still waiting are answered
// with errClosed, and later ones go alone (and fail on the closed
// connection). The store closes its connection first, so that the groups
// on their way fail at once instead of waiting for a stopped node. A
// committer being added now either sees closed or is closed here: each
// runs under the lock that adds it.
func (cs *committers) close() {
	cs.closed.Store(true)
	cs.nodes.each(func(c *committer) {
		c.mu.Lock()
		q := c.queue
		c.queue = nil
		c.closed = true
		c.mu.Unlock()
		for _, p := range q {
			p.res = rueidis.NewErrorResult(errClosed)
			p.done <- struct{}{}
		}
	})
}

// committer sends one node's commands: at most commitLanes sends (a
// command alone or a group) on their way at a time.
type committer struct {
	s      *Store
	cs     *committers
	mu     sync.Mutex
	busy   int // sends on their way; the queue is empty while busy < commitLanes
	queue  []*pending
	closed bool
}

// pending is a command waiting for its group. done receives once, when
// res is set; a pending whose caller took its answer is used again. left
// is set when its caller gave up waiting: a command not yet taken into a
// group is then dropped, not sent (after a pause, the queue would
// otherwise charge Redis for callers long gone).
type pending struct {
	cmd rueidis.Completed
	// fast is set for a call of gcra_fast.lua that a group may gather
	// with others into one call (fastGroup).
	fast fastCall
	res  rueidis.RedisResult
	done chan struct{}
	left atomic.Bool
}

// fastCall is one key's call of gcra_fast.lua or fixedwindow_fast.lua
// (window), with Redis TIME: its key and ARGV (shared read-only,
// fastParams.argv).
type fastCall struct {
	key    string
	args   []string
	window bool
}

// errClosed answers the commands that a closing store did not send.
var errClosed = fmt.Errorf("redisstore: %w: the store is closed", ErrUnavailable)

// do sends cmd to the node, at once when a lane is free, else with the
// next group. It returns when the answer is in or ctx is done. The command
// of a caller that left is dropped if no group holds it yet; one already
// sent still runs (the plain path counts it: stricter).
func (c *committer) do(ctx context.Context, client rueidis.Client, cmd rueidis.Completed) rueidis.RedisResult {
	return c.doFast(ctx, client, cmd, fastCall{})
}

// doFast is do for a command that, when it waits for a group, the group
// may send within one call of gcra_fast.lua with the group's other such
// commands (fast.key set), instead of cmd.
func (c *committer) doFast(ctx context.Context, client rueidis.Client, cmd rueidis.Completed, fast fastCall) rueidis.RedisResult {
	c.mu.Lock()
	if c.busy < commitLanes || c.closed {
		c.busy++
		c.mu.Unlock()
		if h := c.s.commitHook; h != nil {
			h("direct", 1)
		}
		res := client.Do(ctx, cmd)
		c.next()
		return res
	}
	if len(c.queue) >= maxQueued {
		c.mu.Unlock()
		return client.Do(ctx, cmd)
	}
	p, _ := c.cs.pool.Get().(*pending)
	if p == nil {
		p = &pending{done: make(chan struct{}, 1)}
	}
	p.cmd, p.fast = cmd, fast
	c.queue = append(c.queue, p)
	if h := c.s.commitHook; h != nil {
		h("queued", len(c.queue))
	}
	c.mu.Unlock()
	select {
	case <-p.done:
		res := p.res
		p.cmd, p.fast, p.res = rueidis.Completed{}, fastCall{}, rueidis.RedisResult{}
		c.cs.pool.Put(p)
		return res
	case <-ctx.Done():
		p.left.Store(true) // p is dropped, not reused
		return rueidis.NewErrorResult(ctx.Err())
	}
}

// next ends a send: if commands queued meanwhile, its lane goes on with
// them as a group, on a goroutine of its own so that the caller of the
// send returns at once; else the lane is free again.
func (c *committer) next() {
	if g := c.take(); g != nil {
		go c.run(g)
	}
}

// run sends groups on one lane until the queue is empty.
func (c *committer) run(g []*pending) {
	for g != nil {
		c.sendGroup(g)
		g = c.take()
	}
}

// take removes the next group from the queue, leaving out the commands
// whose callers left; when none is left, the lane is free again and take
// returns nil.
func (c *committer) take() []*pending {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := make([]*pending, 0, min(len(c.queue), maxGroup))
	i := 0
	for ; i < len(c.queue) && len(g) < maxGroup; i++ {
		if p := c.queue[i]; !p.left.Load() {
			g = append(g, p)
		}
	}
	rest := copy(c.queue, c.queue[i:])
	clear(c.queue[rest:])
	c.queue = c.queue[:rest]
	if len(g) == 0 { // the whole queue was read: it is empty now
		c.busy--
		return nil
	}
	return g
}

// sendGroup sends group in one DoMulti, bounded by the store's timeout,
// and hands each command its answer. The group's gcra_fast.lua calls go
// as calls of fastGroup keys each (fastGroup).
func (c *committer) sendGroup(group []*pending) {
	c.cs.groups.Add(1)
	c.cs.grouped.Add(uint64(len(group)))
	if h := c.s.commitHook; h != nil {
		h("group", len(group))
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.s.timeout)
	defer cancel()
	client := c.s.client()
	if client == nil {
		for _, p := range group {
			p.res = rueidis.NewErrorResult(c.s.notConnected())
			p.done <- struct{}{}
		}
		return
	}
	// The group's order is no order its callers imposed (each waited for
	// its answer, none for another's), so the fast calls go first, by
	// script.
	parts, rest := fastParts(group)
	cmds := make([]rueidis.Completed, 0, len(parts)+len(rest))
	for _, part := range parts {
		cmds = append(cmds, c.s.fastGroupCmd(client, part, false))
	}
	for _, p := range rest {
		cmds = append(cmds, p.cmd)
	}
	res := client.DoMulti(ctx, cmds...)
	for i, part := range parts {
		if err, ok := rueidis.IsRedisErr(res[i].Error()); ok && err.IsNoScript() {
			// Redis lost the script (a restart, SCRIPT FLUSH): EVAL loads it.
			res[i] = client.Do(ctx, c.s.fastGroupCmd(client, part, true))
		}
		c.cs.gathered.Add(uint64(len(part)))
		answerFast(part, res[i])
	}
	for i, p := range rest {
		p.res = res[len(parts)+i]
		p.done <- struct{}{}
	}
	if h := c.s.commitHook; h != nil {
		h("answered", len(group))
	}
}

// groupOf returns the committer of node (NodeOf a key), or nil when
// commands go alone: when the store was built without group commit, or on
// a Cluster whose slots it does not know yet (a group must not wait on two
// nodes).
func (s *Store) groupOf(node string) *committer {
	if s.noGroupCommit || (s.cluster && s.slots.Load() == nil) {
		return nil
	}
	return s.commit.of(node, s)
}

// exec runs script on keys (which share a node) with EVALSHA through
// their node's group; a node that has lost the script (NOSCRIPT, after a
// restart or SCRIPT FLUSH) is sent it by rueidis, alone. alone sends it
// alone anyway, for a call that keeps a deadline of its own (a group has
// the store's timeout).
func (s *Store) exec(ctx context.Context, client rueidis.Client, script *rueidis.Lua, keys, args []string, alone bool) rueidis.RedisResult {
	if alone {
		if sluice.WaitsForReply(ctx) {
			return s.execDedicated(ctx, client, script, keys, args)
		}
		return script.Exec(ctx, client, keys, args)
	}
	group := s.groupOf(s.NodeOf(keys[0]))
	sha := s.scripts.sha[script]
	if group == nil || sha == "" {
		return script.Exec(ctx, client, keys, args)
	}
	var fast fastCall
	if ok, window := s.gatherable(sha, keys, args); ok {
		fast = fastCall{key: keys[0], args: args, window: window}
	}
	res := group.doFast(ctx, client, client.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), fast)
	if err, ok := rueidis.IsRedisErr(res.Error()); ok && err.IsNoScript() {
		return script.Exec(ctx, client, keys, args)
	}
	return res
}

// dedicatedPoolSize is the most connections execDedicated holds per
// node at once (rueidis' BlockingPoolSize): a lease's chunk fetch is one
// script, so 16 in flight serve some 16 × 5,000 fetches a second.
const dedicatedPoolSize = 16

// dedicatedPoolCleanup is how long the dedicated connections past one may
// stay idle before rueidis closes them.
const dedicatedPoolCleanup = 30 * time.Second

// execDedicated runs a call marked by sluice.WaitForReply (a lease's chunk
// fetch) on a connection of its own (rueidis' Dedicate, from a pool): on
// the shared one, another call that missed its deadline in rueidis'
// synchronous mode closes the connection and fails every call on it, so
// a fetch waiting for its reply lost it all the same, and with it the
// chunk Redis charged. The connection's write timeout (Options.Timeout ×
// 4, at least 1 s) still bounds the wait.
func (s *Store) execDedicated(ctx context.Context, client rueidis.Client, script *rueidis.Lua, keys, args []string) rueidis.RedisResult {
	sha := s.scripts.sha[script]
	if sha == "" {
		return script.Exec(ctx, client, keys, args)
	}
	dc, release := client.Dedicate()
	defer release()
	res := dc.Do(ctx, dc.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if err, ok := rueidis.IsRedisErr(res.Error()); ok && err.IsNoScript() {
		return script.Exec(ctx, client, keys, args) // loads it again
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
