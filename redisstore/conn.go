package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// conn is the store's client. When Redis cannot be reached at New, or the
// store was made while Redis was down, it connects later: each call that
// finds no client starts one attempt in the background (at most one per
// retryEvery), and fails with ErrUnavailable meanwhile.
type conn struct {
	opt       rueidis.ClientOption
	mode      string
	owns      bool // Close closes the client
	cluster   bool
	name      string // the seed addresses, for logs
	log       *slog.Logger
	onConnect func(context.Context, rueidis.Client)

	cl      atomic.Pointer[rueidis.Client]
	mu      sync.Mutex
	dialing bool
	lastTry time.Time
	closed  bool
	logAt   time.Time

	// slots maps each Cluster hash slot to the address of its master, as
	// CLUSTER SLOTS last reported it; nil until known or when standalone.
	slots     atomic.Pointer[[16384]string]
	slotsAt   atomic.Int64 // Unix ns of the last refresh
	slotsMu   sync.Mutex
	slotNames atomic.Pointer[[]string]
}

// retryEvery spaces connection attempts.
const retryEvery = 200 * time.Millisecond

func (c *conn) set(cl rueidis.Client) { c.cl.Store(&cl) }

func (c *conn) client() rueidis.Client {
	if p := c.cl.Load(); p != nil {
		return *p
	}
	return nil
}

// connect tries once to connect, now, within ctx.
func (c *conn) connect(ctx context.Context) error {
	type result struct {
		cl  rueidis.Client
		err error
	}
	done := make(chan result, 1)
	go func() { // NewClient dials without ctx
		cl, err := rueidis.NewClient(c.opt)
		done <- result{cl, err}
	}()
	select {
	case r := <-done:
		return c.connected(ctx, r.cl, r.err)
	case <-ctx.Done():
		go func() {
			r := <-done
			_ = c.connected(context.Background(), r.cl, r.err)
		}()
		return fmt.Errorf("%w: connect (%s %s): %w", ErrUnavailable, c.mode, c.name, ctx.Err())
	}
}

func (c *conn) connected(ctx context.Context, cl rueidis.Client, err error) error {
	if err != nil {
		return fmt.Errorf("%w: connect (%s %s): %w", ErrUnavailable, c.mode, c.name, err)
	}
	c.mu.Lock()
	if c.closed || c.client() != nil {
		c.mu.Unlock()
		cl.Close()
		return nil
	}
	c.set(cl)
	c.mu.Unlock()
	if c.onConnect != nil {
		c.onConnect(ctx, cl)
	}
	return nil
}

// notConnected starts a connection attempt unless one is under way or
// the last was too recent, and returns the error of a call made meanwhile.
func (c *conn) notConnected() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dialing && !c.closed && time.Since(c.lastTry) >= retryEvery && c.owns {
		c.dialing, c.lastTry = true, time.Now()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*c.opt.Dialer.Timeout)
			err := c.connect(ctx)
			cancel()
			c.mu.Lock()
			c.dialing = false
			logNow := err != nil && time.Since(c.logAt) >= 10*time.Second
			if logNow {
				c.logAt = time.Now()
			}
			c.mu.Unlock()
			switch {
			case err == nil:
				c.log.Info("redisstore: connected", "mode", c.mode, "node", c.name)
			case logNow:
				c.log.Warn("redisstore: cannot connect; retrying", "mode", c.mode, "node", c.name, "err", err)
			}
		}()
	}
	return fmt.Errorf("redisstore: %w: not connected to %s", ErrUnavailable, c.name)
}

func (c *conn) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	if cl := c.client(); cl != nil && c.owns {
		cl.Close()
	}
}

// refused reports an error that retrying will not fix: Redis refused the
// credentials, or the server's certificate is not trusted.
func refused(err error) bool {
	var re *rueidis.RedisError
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	return errors.As(err, &re) || errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci)
}

// NodeOf implements guard.Sharded: on Cluster the address of the master
// that owns key's hash slot (as CLUSTER SLOTS last said, refreshed by
// Nodes), else the configured addresses.
func (s *Store) NodeOf(key string) string {
	if t := s.slots.Load(); t != nil {
		return t[keySlot(key)]
	}
	return s.name
}

// Nodes implements guard.Sharded: the masters that own slots, refreshed
// from CLUSTER SLOTS at most every 500ms, or the configured addresses.
func (s *Store) Nodes(ctx context.Context) ([]string, error) {
	if !s.cluster {
		return []string{s.name}, nil
	}
	if err := s.refreshSlots(ctx); err != nil {
		if p := s.slotNames.Load(); p != nil {
			return *p, nil
		}
		return nil, err
	}
	return *s.slotNames.Load(), nil
}

func (s *Store) refreshSlots(ctx context.Context) error {
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	if time.Since(time.Unix(0, s.slotsAt.Load())) < 500*time.Millisecond && s.slotNames.Load() != nil {
		return nil
	}
	client := s.client()
	if client == nil {
		return s.notConnected()
	}
	var lastErr error
	nodes := client.Nodes()
	each := 100 * time.Millisecond // a dead node must not use up ctx
	if dl, ok := ctx.Deadline(); ok {
		each = max(time.Until(dl)/time.Duration(max(len(nodes), 1)), 10*time.Millisecond)
	}
	for _, node := range nodes { // any node that answers will do
		nctx, cancel := context.WithTimeout(ctx, each)
		shards, err := node.Do(nctx, node.B().ClusterSlots().Build()).ToArray()
		cancel()
		if err != nil {
			lastErr = err
			if ctx.Err() != nil {
				break
			}
			continue
		}
		var t [16384]string
		var names []string
		for _, sh := range shards {
			f, err := sh.ToArray()
			if err != nil || len(f) < 3 {
				continue
			}
			lo, err1 := f[0].AsInt64()
			hi, err2 := f[1].AsInt64()
			m, err3 := f[2].ToArray()
			if err1 != nil || err2 != nil || err3 != nil || len(m) < 2 || lo < 0 || hi >= 16384 || lo > hi {
				continue
			}
			host, _ := m[0].ToString()
			port, _ := m[1].AsInt64()
			addr := host + ":" + strconv.FormatInt(port, 10)
			for i := lo; i <= hi; i++ {
				t[i] = addr
			}
			if !slices.Contains(names, addr) {
				names = append(names, addr)
			}
		}
		if len(names) == 0 {
			continue
		}
		slices.Sort(names)
		s.slots.Store(&t)
		s.slotNames.Store(&names)
		s.slotsAt.Store(time.Now().UnixNano())
		return nil
	}
	if lastErr == nil {
		lastErr = errors.New("no node reported slots")
	}
	return fmt.Errorf("redisstore: %w: cluster slots: %w", ErrUnavailable, lastErr)
}

// PingNode implements guard.Sharded: PING to node (on Cluster, a master's
// address as Nodes names it; else the whole deployment).
func (s *Store) PingNode(ctx context.Context, node string) error {
	client := s.client()
	if client == nil {
		return s.notConnected()
	}
	if s.cluster {
		nc, ok := client.Nodes()[node]
		if !ok {
			return fmt.Errorf("redisstore: %w: node %s not connected", ErrUnavailable, node)
		}
		client = nc
	}
	pctx, cancel := pipelined(ctx)
	defer cancel()
	if err := client.Do(pctx, client.B().Ping().Build()).Error(); err != nil {
		if cerr := ctx.Err(); cerr != nil && errors.Is(err, context.Canceled) {
			err = cerr // the caller's deadline, not a cancellation of ours
		}
		return fmt.Errorf("redisstore: %w: ping %s: %w", ErrUnavailable, node, err)
	}
	return nil
}

// pipelined returns a context that ends when ctx does but has no deadline,
// so that rueidis sends the command on its pipeline: a command with a
// deadline sent alone goes in rueidis' synchronous mode, which closes the
// connection when the deadline passes, and the next one pays a redial
// (its handshake's round trip). A probe with a deadline under two round
// trips then never reached a Redis slower than half of it again: every
// ping timed out and redialled (TestPingReachesSlowRedis). Pipelined, a
// late reply is read and dropped, and the next ping finds the connection.
func pipelined(ctx context.Context) (context.Context, context.CancelFunc) {
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	return pctx, func() {
		stop()
		cancel()
	}
}

// Ping returns nil when Redis answers PING (every master, on Cluster).
func (s *Store) Ping(ctx context.Context) error {
	nodes, err := s.Nodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if err := s.PingNode(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// heartbeatScript adds or renews member ARGV[1] until Redis TIME + ARGV[2]
// ms in the sorted set KEYS[1], drops the lapsed members, and returns how
// many are left. One set, not a key per instance: counting it is one
// call, also on Cluster.
var heartbeatScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
`)

// Heartbeat implements guard.Membership: instance id is alive for ttl in
// the set Options.InstancesKey; it returns the number of live instances.
func (s *Store) Heartbeat(ctx context.Context, id string, ttl time.Duration) (int, error) {
	client := s.client()
	if client == nil {
		return 0, s.notConnected()
	}
	n, err := heartbeatScript.Exec(ctx, client, []string{s.beatKey}, []string{id, strconv.FormatInt(max(ttl.Milliseconds(), 1), 10)}).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("redisstore: %w: heartbeat: %w", ErrUnavailable, err)
	}
	return int(n), nil
}

// Leave implements guard.Membership: it removes instance id at once.
func (s *Store) Leave(ctx context.Context, id string) error {
	client := s.client()
	if client == nil {
		return s.notConnected()
	}
	return client.Do(ctx, client.B().Zrem().Key(s.beatKey).Member(id).Build()).Error()
}
