// Package rlqs serves Envoy's Rate Limit Quota Service,
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas,
// beside the rate limit service on the Envoy gRPC port of `sluice serve`.
//
// # Design
//
// An Envoy's rate_limit_quota filter holds one stream to the service. It
// reports, every reporting_interval, each bucket's requests allowed and
// denied and the time elapsed; the service answers each report with an
// action per bucket: a token-bucket assignment, a blanket deny, or abandon.
// The filter enforces the assignment locally until it is replaced or its
// time to live runs out.
//
// Each bucket's limit is a rate divided among the streams that report it,
// in the store, so that several sluice instances on one Redis divide one
// budget: a policy's capacity is C tokens per fill interval F (fillOf),
// and each stream holds a share of it as a lease of the store's
// concurrency algorithm, renewed by each report for the assignment's time
// to live and an interval more. A report takes the stream's share with
// OpTake, in one atomic step that grants what is free besides the
// stream's own lease (a partial grant, never all or nothing), so reports
// that arrive together divide what is there instead of one losing a race.
// The sum of the shares held is at most C at every instant, and an Envoy
// spends its share at tokens_per_fill per fill_interval, so the fleet's
// rate is at most the limit's; what it adds is each fresh Envoy bucket's
// max_tokens (docs/envoy.md gives the bound).
//
// How much a stream asks for is its share of the fleet's demand: each
// report also sets the stream's demand (allowed + denied, per F) as its
// lease in a second concurrency key whose slots used are the fleet's
// demand; a stream asks C × its demand / the fleet's demand when the
// fleet wants more than C, and its demand and half again when not. Both
// takes of every bucket of a report go to the store in one ApplyAll (the
// domain is the keys' hash tag): one round trip per report.
//
// A policy with scope global is one limit for every region's Envoys: each
// instance leases part of C at the home region's store, sized by its
// demand against every region's, and its streams divide only what it
// holds; no assignment outlives that lease (global.go).
package rlqs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// demandRate is the demand key's slots: far above any demand, so that its
// take always sets the stream's lease and its slots used are the sum.
const demandRate = 1 << 40

// chunkBuckets is the most buckets of one report in one store call.
const chunkBuckets = 16

// stickiness is the change of a stream's share below which its last
// assignment is kept: an unchanged assignment keeps the Envoy's token
// bucket (Envoy's global_client_impl.cc, shouldReplaceTokenBucket), a
// changed one starts a fresh, full one, whose max_tokens is what a change
// adds to the fleet's bound.
const stickiness = 0.1

// Options configures a Server.
type Options struct {
	// Store holds the capacity; required. It must take sluice.OpTake on
	// the concurrency algorithm (memstore and redisstore do).
	Store sluice.Store
	// Config is the `rlqs:` section; required.
	Config *Config
	// Live, if set, returns the running `rlqs:` section, which may change
	// with a reload: a report applies the section it returns, so new
	// limits reach existing buckets at their next report. Nil keeps Config.
	Live func() *Config
	// Prefix is put before every store key; default "rlqs:".
	Prefix string
	// Clock measures report intervals and the per-client budgets; default
	// the system clock.
	Clock clock.Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil means none are exported.
	Registerer prometheus.Registerer
	// Global reaches the other regions' stores, for the policies with
	// scope global (global.go); required when the config has one.
	Global *Global
}

// Server serves StreamRateLimitQuotas. It is safe for concurrent use.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	store  sluice.Store
	live   func() *Config
	prefix string
	clock  clock.Clock
	log    *slog.Logger
	warn   *rateLog
	m      *metrics
	id     string // this instance's part of the lease ids
	seq    atomic.Uint64

	cfgMu sync.Mutex
	cfg   atomic.Pointer[compiled]

	peers   *peerTable
	pending *budget    // bytes of the reports read and not yet answered
	slots   *fairSlots // the store calls in flight, over all clients
	// heavyWork is held by the one goroutine that plans a heavy client's
	// report (peerTable.heavy; not while it waits for the store): a few
	// clients reporting at their caps plan one report at a time, and a
	// light client's goroutines wait behind one of theirs in Go's run
	// queue, not dozens.
	heavyWork chan struct{}

	done     chan struct{} // closed by Drain
	drainOne sync.Once

	glob *globals // the region leases of global policies; nil without Options.Global
}

// compiled is a checked section in force.
type compiled struct {
	src      *Config
	domains  map[string]*domainPolicies
	interval time.Duration
	ttl      time.Duration
	ttlPB    *durationpb.Duration // ttl, shared by the answers (read only)
	maxBkts  int
	maxUsage int
}

func compileConfig(c *Config) (*compiled, error) {
	domains, err := c.compileAll()
	if err != nil {
		return nil, err
	}
	return &compiled{src: c, domains: domains, interval: c.interval(), ttl: c.ttl(), ttlPB: durationpb.New(c.ttl()),
		maxBkts:  orDefault(c.MaxBucketsPerStream, DefaultMaxBucketsPerStream),
		maxUsage: orDefault(c.MaxUsagesPerReport, DefaultMaxUsagesPerReport)}, nil
}

// New validates opts and returns a Server.
func New(opts Options) (*Server, error) {
	if opts.Store == nil || opts.Config == nil {
		return nil, errors.New("rlqs: Options.Store and Options.Config are required")
	}
	c, err := compileConfig(opts.Config)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	s := &Server{
		store:  opts.Store,
		live:   opts.Live,
		prefix: opts.Prefix,
		clock:  opts.Clock,
		log:    opts.Logger,
		m:      m,
		id:     hex.EncodeToString(rnd[:]),
		done:   make(chan struct{}),
	}
	s.cfg.Store(c)
	if s.prefix == "" {
		s.prefix = "rlqs:"
	}
	if s.clock == nil {
		s.clock = clock.NewSystem()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.warn = newRateLog(s.log, s.clock, logPeriod)
	s.peers = newPeerTable(s.clock, opts.Config)
	s.slots = newFairSlots(storeSlots)
	s.heavyWork = make(chan struct{}, 1)
	s.pending = &budget{left: MaxPendingBytes}
	if opts.Global != nil {
		if s.glob, err = newGlobals(s, *opts.Global); err != nil {
			return nil, err
		}
		go s.glob.run()
	} else if c.hasGlobal() {
		return nil, fmt.Errorf("%w: a policy with scope global needs Options.Global (serve's store.region and store.regions)", ErrConfig)
	}
	return s, nil
}

// hasGlobal reports whether a policy of the section has scope global.
func (c *compiled) hasGlobal() bool {
	for _, d := range c.domains {
		for _, p := range d.policies {
			if p.global {
				return true
			}
		}
	}
	return false
}

// config returns the section in force, compiling the live one first if
// it changed. A live section that does not compile (it passed the
// config's checks, so it should) keeps the one in force, with a log line.
func (s *Server) config() *compiled {
	c := s.cfg.Load()
	if s.live == nil {
		return c
	}
	next := s.live()
	if next == nil || next == c.src {
		return c
	}
	s.cfgMu.Lock()
	defer s.cfgMu.Unlock()
	if c = s.cfg.Load(); next == c.src {
		return c
	}
	n, err := compileConfig(next)
	if err != nil {
		s.warn.log("config", "rlqs: reloaded section refused; keeping the running one", "err", err.Error())
		return c
	}
	s.cfg.Store(n)
	s.peers.setLimits(next)
	s.log.Info("rlqs: reloaded section applied: new limits reach each bucket at its next report", "report_interval", n.interval, "assignment_ttl", n.ttl)
	return n
}

// Register adds the service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { rlqsv3.RegisterRateLimitQuotaServiceServer(g, s) }

// Drain ends every stream, now and from now on, with UNAVAILABLE: Envoy
// reconnects, to another instance behind its cluster, and keeps its
// assignments until they expire meanwhile. sluice serve calls it before
// its graceful stop, which would otherwise wait for the streams forever.
func (s *Server) Drain() { s.drainOne.Do(func() { close(s.done) }) }

// Held is what a Server holds for its clients, the structures its memory
// ceiling bounds.
type Held struct {
	Streams      int   // open streams
	Buckets      int   // buckets of all streams
	Peers        int   // client IPs with a budget or a stream
	PendingBytes int64 // reports read and not yet answered, in wire bytes
}

// Held returns what the server holds now.
func (s *Server) Held() Held {
	h := s.peers.held()
	s.pending.mu.Lock()
	h.PendingBytes = MaxPendingBytes - s.pending.left
	s.pending.mu.Unlock()
	return h
}

// ErrDegraded means the store answered without its backend (a guard's
// failure policy): no capacity is assigned from such an answer.
var ErrDegraded = errors.New("rlqs: store degraded")

// Errors of a stream, as gRPC statuses.
var (
	errTooManyStreams = status.Error(codes.ResourceExhausted, "rlqs: too many streams from this client")
	errServerFull     = status.Error(codes.ResourceExhausted, "rlqs: too many streams on this server")
	errNoDomain       = status.Error(codes.InvalidArgument, "rlqs: the first report must name the domain")
	errDraining       = status.Error(codes.Unavailable, "rlqs: sluice is shutting down; reconnect")
)

// bucket is one bucket id's state on one stream.
type bucket struct {
	policy *policy
	key    string // store key part: domain (hash tag), policy and hash of the id
	// demandKey is key + demandSuffix, whose first part key is.
	demandKey string
	fill      time.Duration
	assigned  int64 // tokens per fill of the assignment in force; 0: none
	demand    int64 // the stream's demand per fill at its last report
	fleet     int64 // the fleet's demand per fill, as the last report read it
	reported  int64 // clock time of the last report that went to the store
	taken     bool  // the store answered for it: assigned is an assignment
	carry     int64 // requests of reports answered without the store since
	// strategy is the token bucket of assigned tokens per fill, kept
	// while the assignment is (read only: answers share it).
	strategy *typev3.RateLimitStrategy
	// home is a global bucket's key at its home (global.go); glob its
	// region lease, looked up at each report; ttl the TTL of its
	// assignment in force (0: the configured one).
	home string
	glob *globalBucket
	ttl  time.Duration
}

// demandSuffix ends the key of a bucket's demand leases.
const demandSuffix = ":demand"

// stream is one Envoy's stream.
type stream struct {
	id      string // lease id in the store
	host    string
	dom     *domainPolicies
	domain  string // the gauge's label, once counted
	buckets map[[16]byte]*bucket
}

// StreamRateLimitQuotas implements the service: one Envoy's stream.
func (s *Server) StreamRateLimitQuotas(gs grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	ctx := gs.Context()
	host := peerHost(ctx)
	switch s.peers.open(host) {
	case refusedPeer:
		s.m.refused.WithLabelValues("streams_per_peer").Inc()
		return errTooManyStreams
	case refusedServer:
		s.m.refused.WithLabelValues("streams").Inc()
		return errServerFull
	}
	st := &stream{id: s.id + "." + strconv.FormatUint(s.seq.Add(1), 36), host: host, buckets: map[[16]byte]*bucket{}}
	defer func() {
		s.peers.close(host, len(st.buckets))
		if st.domain != "" {
			s.m.streams.WithLabelValues(st.domain).Dec()
		}
	}()
	type recv struct {
		msg  *rlqsv3.RateLimitQuotaUsageReports
		err  error
		size int64 // taken from the pending budget
	}
	// Recv runs on its own so that Drain can end the stream; it ends when
	// the handler returns, as that cancels the stream. It reads the next
	// message only when the handler has taken the last: a stream holds at
	// most one report beyond the one being answered.
	msgs := make(chan recv)
	go func() {
		for {
			// A client over its report budget has its streams left
			// unread until the next interval: its reports wait in HTTP/2
			// flow control, not decoded in this server's memory and time.
			if d := s.peers.overBudget(host); d > 0 {
				wait := time.NewTimer(d + s.spread())
				select {
				case <-wait.C:
				case <-ctx.Done():
					wait.Stop()
					return
				}
				continue
			}
			// The reports decoded or held, server-wide, are bounded in
			// bytes: a report beyond the budget is dropped as soon as it
			// is read, undecoded and unanswered (the Envoy keeps its
			// assignments; gate.go).
			in := &gatedReport{s: s, limit: maxReportBytes(s.cfg.Load().maxUsage)}
			err := gs.RecvMsg(in)
			var msg *rlqsv3.RateLimitQuotaUsageReports
			size := in.size
			if err == nil && in.refused != nil {
				s.m.refused.WithLabelValues("report_bytes").Inc()
				err = in.refused
			}
			if err == nil {
				if in.dropped > 0 {
					s.m.dropped.WithLabelValues("pending").Add(float64(in.dropped))
					s.warn.log("pending", "rlqs: reports held at max_pending_bytes; reports dropped")
					continue
				}
				msg = &in.msg
				if size == 0 {
					// Decoded by a plain proto codec: weighed now.
					size = int64(proto.Size(msg))
					if !s.pending.take(size) {
						s.m.dropped.WithLabelValues("pending").Add(float64(len(msg.GetBucketQuotaUsages())))
						s.warn.log("pending", "rlqs: reports held at max_pending_bytes; reports dropped")
						continue
					}
				}
			}
			select {
			case msgs <- recv{msg, err, size}:
			case <-ctx.Done():
				s.pending.give(size)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		var r recv
		select {
		case r = <-msgs:
		case <-s.done:
			return errDraining
		case <-ctx.Done(): // the client went away
			return status.FromContextError(ctx.Err()).Err()
		}
		if errors.Is(r.err, io.EOF) {
			return nil
		}
		if r.err != nil {
			return r.err
		}
		resp, err := s.report(ctx, st, r.msg)
		s.pending.give(r.size)
		if err != nil {
			return err
		}
		if resp == nil {
			// Over the client's budget: nothing more is read from this
			// stream until the next interval, so that gRPC's flow control
			// holds the client's sends, at no cost to the server.
			wait := time.NewTimer(s.peers.untilNext() + s.spread())
			select {
			case <-wait.C:
			case <-s.done:
				wait.Stop()
				return errDraining
			case <-ctx.Done():
				wait.Stop()
				return status.FromContextError(ctx.Err()).Err()
			}
			continue
		}
		if len(resp.GetBucketAction()) == 0 {
			continue
		}
		if err := gs.Send(resp); err != nil {
			return err
		}
	}
}

// spread is a random part of half an interval added to the wait of a
// stream over its client's budget: a flood's streams, held until the next
// interval, then decode their next reports spread over it, not all at
// its first instant (a burst that stalled every client's answers).
func (s *Server) spread() time.Duration {
	return mrand.N(s.cfg.Load().interval/2 + 1)
}

// pending is one bucket's part of a report: its usage and what the store
// is asked for it.
type pending struct {
	u      *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
	b      *bucket
	mine   int64 // demand per fill
	demand int64 // as set in the store (at least 1)
	want   int64
	rate   int64 // the capacity divided: the policy's, or a global bucket's region lease
	fleet  int64 // the fleet's demand the share was sized by
	// first: a global bucket whose instance held none of it when planned
	// (its first renewal under way): its share is sized again once the
	// renewal is in, within the report's store time.
	first bool
}

// report answers one message: the actions of its buckets, or an error
// that ends the stream; nil and no error when the client is over its
// budget.
func (s *Server) report(ctx context.Context, st *stream, msg *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	cfg := s.config()
	if st.dom == nil {
		if msg.GetDomain() == "" {
			return nil, errNoDomain
		}
		st.dom = cfg.domains[msg.GetDomain()]
		if st.dom == nil {
			s.m.refused.WithLabelValues("unknown_domain").Inc()
			return nil, status.Errorf(codes.NotFound, "rlqs: domain %q is not configured", truncate(msg.GetDomain()))
		}
		st.domain = st.dom.name
		s.m.streams.WithLabelValues(st.domain).Inc()
	}
	if d := cfg.domains[st.dom.name]; d != nil {
		st.dom = d // a reload's policies
	}
	usages := msg.GetBucketQuotaUsages()
	if len(usages) > cfg.maxUsage {
		s.m.refused.WithLabelValues("usages_per_report").Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "rlqs: %d bucket usages in one report; at most %d", len(usages), cfg.maxUsage)
	}
	// The client's budget: a report beyond it is dropped whole, before any
	// work, and the Envoy keeps its assignments until their TTL.
	if !s.peers.spend(st.host, len(usages)) {
		s.m.dropped.WithLabelValues("peer_reports").Add(float64(len(usages)))
		s.warn.log("peer_reports", "rlqs: client over its report budget; reports dropped, its streams read again next interval", "peer", hashPeer(st.host))
		return nil, nil
	}
	if s.peers.heavy(st.host) {
		select {
		case s.heavyWork <- struct{}{}:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		held := true
		defer func() {
			if held {
				<-s.heavyWork
			}
		}()
		release := func() {
			if held {
				held = false
				<-s.heavyWork
			}
		}
		return s.answer(ctx, cfg, st, usages, release)
	}
	return s.answer(ctx, cfg, st, usages, func() {})
}

// answer is report's work on the usages of a report within the budgets:
// release is called once the planning is done, before the store calls.
func (s *Server) answer(ctx context.Context, cfg *compiled, st *stream, usages []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, release func()) (*rlqsv3.RateLimitQuotaResponse, error) {
	now := s.clock.Now()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var work []pending
	for _, u := range usages {
		id := u.GetBucketId().GetBucket()
		if err := checkID(id); err != nil {
			s.m.refused.WithLabelValues("bucket_id").Inc()
			return nil, err
		}
		h := hashID(id)
		b := st.buckets[h]
		if b == nil {
			if len(st.buckets) >= cfg.maxBkts {
				s.m.refused.WithLabelValues("buckets_per_stream").Inc()
				return nil, status.Errorf(codes.ResourceExhausted, "rlqs: more than %d buckets on one stream", cfg.maxBkts)
			}
			switch s.peers.newBucket(st.host) {
			case refusedPeer:
				s.m.dropped.WithLabelValues("peer_new_buckets").Inc()
				s.warn.log("peer_new_buckets", "rlqs: client over its new-bucket budget; buckets left without an assignment", "peer", hashPeer(st.host))
				continue
			case refusedServer:
				s.m.dropped.WithLabelValues("buckets").Inc()
				s.warn.log("buckets", "rlqs: server at max_buckets; buckets left without an assignment")
				continue
			}
			b = &bucket{}
			st.buckets[h] = b
		}
		p := st.dom.lookup(id)
		if p == nil {
			b.policy = nil
			s.m.assignments.WithLabelValues(st.dom.name, "", "abandon").Inc()
			resp.BucketAction = append(resp.BucketAction, &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: u.GetBucketId(),
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}})
			continue
		}
		s.m.reports.WithLabelValues(st.dom.name, p.name).Inc()
		if p.denied {
			b.policy = p
			s.m.assignments.WithLabelValues(st.dom.name, p.name, "deny").Inc()
			a := blanket(cfg.ttl, typev3.RateLimitStrategy_DENY_ALL)
			a.BucketId = u.GetBucketId()
			resp.BucketAction = append(resp.BucketAction, a)
			continue
		}
		if p != b.policy || p.fill != b.fill {
			// A new bucket, or a reload changed its policy: the same key
			// while the fill interval stays (leases are in its tokens).
			b.policy, b.fill = p, p.fill
			// One string for both keys: the demand key is the share's
			// with a suffix, not a concatenation per report.
			base := s.prefix + "{" + st.dom.name + "}:" + p.name + ":" + strconv.FormatInt(int64(p.fill/time.Second), 10) + ":" + hex.EncodeToString(h[:12])
			b.home = ""
			if p.global {
				// The instance's streams divide its region lease in keys
				// of their own; the home holds the leases at base.
				b.home, base = base, base+":@"+s.id
			}
			b.demandKey = base + demandSuffix
			b.key = b.demandKey[:len(b.demandKey)-len(demandSuffix)]
		}
		b.glob = nil
		if p.global {
			var err error
			if s.glob == nil {
				err = errors.New("rlqs: a global policy on a server without Options.Global")
			} else {
				b.glob, err = s.glob.bucket(b.home, b.key, p, st.dom.name, st.host, now)
			}
			if err != nil {
				s.warn.log("region_lease", "rlqs: a global bucket without its home; denied", "domain", st.dom.name, "policy", p.name, "err", err.Error())
				b.assigned, b.taken, b.ttl = 0, true, 0
				s.m.assignments.WithLabelValues(st.dom.name, p.name, "deny").Inc()
				resp.BucketAction = append(resp.BucketAction, s.action(cfg, b, u.GetBucketId()))
				continue
			}
		}
		if b.reported != 0 && now-b.reported < int64(cfg.interval/2) {
			// Reported again within half an interval of its last store
			// call (an Envoy reports once an interval; a new bucket once
			// more at once): answered from its assignment in force,
			// without a store call, its requests counted in the next
			// report's demand. A client that sends its reports back to
			// back costs the store one call per bucket per half interval.
			b.carry += int64(min(u.GetNumRequestsAllowed(), 1<<40) + min(u.GetNumRequestsDenied(), 1<<40))
			if b.taken {
				s.m.coalesced.Inc()
				if b.glob != nil && b.assigned > 0 {
					// Given again now, the assignment must end before the
					// region lease does.
					if b.ttl = s.glob.ttlAt(cfg, b.glob, now); b.ttl < time.Second {
						b.assigned, b.ttl = 0, 0
					}
				}
				resp.BucketAction = append(resp.BucketAction, s.action(cfg, b, u.GetBucketId()))
			}
			continue
		}
		work = append(work, s.plan(cfg, b, u, now))
	}
	release()
	if len(work) > 0 {
		s.take(ctx, cfg, st, work, resp)
	}
	return resp, nil
}

// plan is what a bucket's report asks of the store: its demand per fill,
// and its share of the capacity.
func (s *Server) plan(cfg *compiled, b *bucket, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now int64) pending {
	p := b.policy
	// The time since this stream's last report of the bucket, on this
	// server's clock (Envoy reports time_elapsed in whole seconds only).
	elapsed := time.Duration(now - b.reported)
	if b.reported == 0 {
		elapsed = cfg.interval
	}
	elapsed = min(max(elapsed, cfg.interval/2), 2*cfg.ttl)
	b.reported = now
	arrivals := float64(u.GetNumRequestsAllowed()) + float64(u.GetNumRequestsDenied()) + float64(b.carry)
	b.carry = 0
	c := p.capacity
	mine := min(int64(math.Ceil(arrivals*float64(p.fill)/float64(elapsed))), 4*c)
	// The fleet's demand with this stream's own part as it is now.
	fleet := max(mine, b.fleet-b.demand+mine)
	b.demand = mine
	if b.glob != nil {
		// A global bucket's streams divide what this instance holds of
		// it (take reads it again, under the bucket's gate).
		c = b.glob.cap.Load()
	}
	want := shareOf(c, mine, fleet, b.assigned)
	if b.glob != nil && (c == 0 || !s.glob.usable(cfg, b.glob, now)) {
		want = 0 // nothing held, or a lease ending too soon: the stream's lease is released
	}
	return pending{u: u, b: b, mine: mine, demand: max(1, mine), want: want, fleet: fleet, first: b.glob != nil && b.glob.expires.Load() == 0}
}

// shareOf is what a stream whose demand is mine asks of a capacity c when
// the fleet's demand is fleet, its current share being assigned: its part
// of c by demand when the fleet wants more than c, else its demand and
// half again (room to grow until the next report); its current share if
// that is within stickiness of it.
func shareOf(c, mine, fleet, assigned int64) int64 {
	var want int64
	if fleet > c {
		want = int64(math.Ceil(float64(c) * float64(mine) / float64(fleet)))
	} else {
		want = mine + mine/2 + 1
	}
	want = max(1, min(want, c))
	if assigned > 0 && math.Abs(float64(want-assigned)) <= stickiness*float64(assigned) {
		want = assigned // keep the Envoy's bucket
	}
	return want
}

// take asks the store for every bucket of a report in one round trip and
// appends their actions to resp. A bucket the store did not answer for
// gets no action: its assignment runs on to its TTL.
func (s *Server) take(ctx context.Context, cfg *compiled, st *stream, work []pending, resp *rlqsv3.RateLimitQuotaResponse) {
	lease := cfg.ttl + cfg.interval // outlives the Envoy's assignment, whose TTL starts when the answer arrives
	sctx, cancel := context.WithTimeout(ctx, cfg.interval/2)
	defer cancel()
	// A global bucket's take uses the capacity its instance holds, under
	// the bucket's gate (global.go); a new one waits for its first
	// renewal, within the report's store time.
	for _, w := range work {
		if gb := w.b.glob; gb != nil {
			select {
			case <-gb.ready:
			case <-sctx.Done():
			}
		}
	}
	for i := range work {
		w := &work[i]
		w.rate = w.b.policy.capacity
		if gb := w.b.glob; gb != nil {
			gb.gate.RLock()
			defer gb.gate.RUnlock()
			w.rate = gb.cap.Load()
			if w.rate == 0 || !s.glob.usable(cfg, gb, s.clock.Now()) {
				w.want = 0
			} else if w.first {
				// Its first renewal came in while the report waited:
				// the share it gives, not a denial for want of it.
				w.want = shareOf(w.rate, w.mine, w.fleet, w.b.assigned)
			}
		}
	}
	// Each bucket's demand (dx[i]), then its share (cx[i]; -1 for a
	// global bucket that takes none: its stream's lease, if any, lapses,
	// as a take of no cost is not one).
	reqs := make([]sluice.Request, 0, 2*len(work))
	dx, cx := make([]int, len(work)), make([]int, len(work))
	for i, w := range work {
		dx[i], cx[i] = len(reqs), -1
		reqs = append(reqs, sluice.Request{Key: w.b.demandKey, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: demandRate, Period: lease}, Cost: w.demand, Lease: st.id})
		if w.want > 0 {
			cx[i] = len(reqs)
			reqs = append(reqs, sluice.Request{Key: w.b.key, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: max(1, w.rate), Period: lease}, Cost: w.want, Lease: st.id})
		}
	}
	ds, err := s.apply(sctx, st, reqs)
	if err != nil {
		for _, w := range work {
			s.m.storeErrors.WithLabelValues(st.dom.name, w.b.policy.name).Inc()
		}
		s.warn.log("store", "rlqs: store: report left without new assignments", "domain", st.dom.name, "buckets", len(work), "err", err.Error())
		return
	}
	// The share was asked with the fleet's demand of the last report; the
	// answer has it as it is now. Where that share is larger than what was
	// taken and capacity is free (the fleet's demand moved), it is taken
	// at once: a second round trip, only while shares move.
	var again []sluice.Request
	var which []int
	for i, w := range work {
		if cx[i] < 0 {
			continue // nothing to take under the region lease
		}
		fresh := demandRate - ds[dx[i]].Remaining
		if want := shareOf(w.rate, w.mine, fresh, w.b.assigned); want > ds[cx[i]].Taken && ds[cx[i]].Remaining > 0 {
			r := reqs[cx[i]]
			r.Cost = want
			again = append(again, r)
			which = append(which, i)
		}
	}
	if len(again) > 0 {
		if ds2, err := s.apply(sctx, st, again); err == nil {
			for k, i := range which {
				if ds2[k].Taken > ds[cx[i]].Taken {
					ds[cx[i]] = ds2[k]
				}
			}
		}
	}
	for i, w := range work {
		b, p := w.b, w.b.policy
		b.fleet = demandRate - ds[dx[i]].Remaining
		var got int64
		if cx[i] >= 0 {
			got = ds[cx[i]].Taken
		}
		b.ttl = 0
		if gb := b.glob; gb != nil {
			// The instance's demand sizes its region lease; a stream
			// that wants more than it holds renews it at once.
			gb.demand.Store(b.fleet)
			// One whose streams now hold less than its lease (it is
			// shrinking) gives the rest back at once.
			if gb.wantsMore(b.fleet) || gb.held.Load() > gb.cap.Load() {
				gb.hungry.Store(true)
				s.glob.nudge()
			}
			// Its assignment ends before the lease does.
			if b.ttl = s.glob.ttlAt(cfg, gb, s.clock.Now()); b.ttl < time.Second {
				got, b.ttl = 0, 0
			}
		}
		if b.assigned > 0 && got != b.assigned {
			s.m.rebalances.WithLabelValues(st.dom.name, p.name).Inc()
		}
		b.assigned, b.taken = got, true
		if got == 0 {
			s.m.assignments.WithLabelValues(st.dom.name, p.name, "deny").Inc()
		} else {
			s.m.assignments.WithLabelValues(st.dom.name, p.name, "tokens").Inc()
		}
		resp.BucketAction = append(resp.BucketAction, s.action(cfg, b, w.u.GetBucketId()))
	}
}

// action is the bucket's assignment in force as an action for id: its
// share as a token bucket, or DENY_ALL when it holds none.
func (s *Server) action(cfg *compiled, b *bucket, id *rlqsv3.BucketId) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	var a *rlqsv3.RateLimitQuotaResponse_BucketAction
	if b.assigned == 0 {
		a = blanket(cfg.ttl, typev3.RateLimitStrategy_DENY_ALL)
	} else {
		st := b.strategy
		if tb := st.GetTokenBucket(); tb == nil || int64(tb.GetTokensPerFill().GetValue()) != min(b.assigned, math.MaxUint32) || tb.GetFillInterval().AsDuration() != b.fill {
			st = TokenBucketFor(b.assigned, b.fill)
			b.strategy = st
		}
		ttl := cfg.ttlPB
		if b.ttl > 0 && b.ttl != cfg.ttl {
			ttl = durationpb.New(b.ttl) // cut to a global bucket's region lease
		}
		a = &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: ttl,
				RateLimitStrategy:    st,
			}}}
	}
	a.BucketId = id
	return a
}

// call is one store call of a client's report, in one of the service's
// slots (fairSlots), retried while the report's time lasts when the store
// was late: a take sets the lease, so sending it again is harmless.
func (s *Server) call(sctx context.Context, spent int, reqs []sluice.Request) ([]sluice.Decision, error) {
	for {
		if !s.slots.acquire(sctx.Done(), spent) {
			return nil, fmt.Errorf("rlqs: waiting for a store slot: %w", sctx.Err())
		}
		ds, err := s.store.ApplyAll(sctx, sluice.OpTake, reqs)
		s.slots.release(spent) // a retry waits its turn again
		if err == nil || !errors.Is(err, sluice.ErrUnavailable) || sctx.Err() != nil {
			return ds, err
		}
	}
}

// apply runs OpTake on reqs in chunks (see take), and reports an error if
// any chunk failed or answered from a failure policy.
func (s *Server) apply(sctx context.Context, st *stream, reqs []sluice.Request) ([]sluice.Decision, error) {
	// Chunks of a few buckets, so that a report of many buckets never
	// holds Redis for long in one script: other clients' calls run between
	// the chunks. A client has at most peerCalls chunks in flight, sent
	// together (the store pipelines calls in flight at once): a report of
	// up to 2 × chunkBuckets buckets takes one round trip.
	slots, spent := s.peers.callSlots(st.host)
	if len(reqs) <= 2*chunkBuckets { // one chunk: no goroutine
		select {
		case slots <- struct{}{}:
		case <-sctx.Done():
			return nil, fmt.Errorf("rlqs: waiting for the client's store calls: %w", sctx.Err())
		}
		defer func() { <-slots }()
		ds, err := s.call(sctx, spent, reqs)
		if err != nil {
			return nil, err
		}
		for i := range ds {
			if ds[i].Degraded {
				return nil, ErrDegraded
			}
		}
		return ds, nil
	}
	return s.applyChunks(sctx, slots, spent, reqs)
}

// applyChunks is apply of a report of more than one chunk: its chunks run
// in turn, at most peerCalls at once.
func (s *Server) applyChunks(sctx context.Context, slots chan struct{}, spent int, reqs []sluice.Request) ([]sluice.Decision, error) {
	ds := make([]sluice.Decision, len(reqs))
	var err error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for lo := 0; lo < len(reqs); lo += 2 * chunkBuckets {
		hi := min(len(reqs), lo+2*chunkBuckets)
		select {
		case slots <- struct{}{}:
		case <-sctx.Done():
			mu.Lock()
			err = fmt.Errorf("rlqs: waiting for the client's store calls: %w", sctx.Err())
			mu.Unlock()
		}
		if sctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			got, e := s.call(sctx, spent, reqs[lo:hi])
			mu.Lock()
			defer mu.Unlock()
			if e != nil {
				err = e
				return
			}
			copy(ds[lo:hi], got)
		}()
	}
	wg.Wait()
	if err == nil {
		for i := range ds {
			if ds[i].Degraded {
				err = ErrDegraded
				break
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return ds, nil
}

// TokenBucketFor is the strategy of a share of g tokens per fill interval:
// a bucket of max(MinBurst, ⌈g·BurstFraction⌉) tokens refilled with g
// every fill (whole seconds: Envoy divides by its seconds).
func TokenBucketFor(g int64, fill time.Duration) *typev3.RateLimitStrategy {
	g = min(g, math.MaxUint32)
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(max(MinBurst, math.Ceil(float64(g)*BurstFraction))),
		TokensPerFill: wrapperspb.UInt32(uint32(g)),
		FillInterval:  durationpb.New(fill),
	}}}
}

func blanket(ttl time.Duration, r typev3.RateLimitStrategy_BlanketRule) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl),
			RateLimitStrategy:    &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}},
		}}}
}

func peerHost(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	if h, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		return h
	}
	return p.Addr.String()
}

// checkID bounds a bucket id.
func checkID(id map[string]string) error {
	if len(id) == 0 {
		return status.Error(codes.InvalidArgument, "rlqs: empty bucket id")
	}
	if len(id) > MaxBucketIDEntries {
		return status.Errorf(codes.InvalidArgument, "rlqs: bucket id has %d entries; at most %d", len(id), MaxBucketIDEntries)
	}
	n := 0
	for k, v := range id {
		n += len(k) + len(v)
	}
	if n > MaxBucketIDBytes {
		return status.Errorf(codes.InvalidArgument, "rlqs: bucket id has %d bytes; at most %d", n, MaxBucketIDBytes)
	}
	return nil
}

// canonical is the bucket id's map as one string, keys sorted; lengths
// prefix each part so no two ids collide.
func canonical(id map[string]string) string { return string(appendCanonical(nil, id)) }

// appendCanonical appends canonical(id) to dst. id is checked (checkID):
// at most MaxBucketIDEntries keys.
func appendCanonical(dst []byte, id map[string]string) []byte {
	var kbuf [MaxBucketIDEntries]string
	keys := kbuf[:0]
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := id[k]
		dst = strconv.AppendInt(dst, int64(len(k)), 10)
		dst = append(dst, ':')
		dst = append(dst, k...)
		dst = strconv.AppendInt(dst, int64(len(v)), 10)
		dst = append(dst, ':')
		dst = append(dst, v...)
	}
	return dst
}

// hashID is the first 16 bytes of the SHA-256 of canonical(id), which
// keeps raw bucket values (user ids, perhaps) out of store keys, and a
// stream's bucket table small whatever the size of the ids. The id is
// checked: its canonical form fits the buffer on the stack.
func hashID(id map[string]string) [16]byte {
	var buf [MaxBucketIDBytes + MaxBucketIDEntries*2*8]byte
	h := sha256.Sum256(appendCanonical(buf[:0], id))
	return [16]byte(h[:16])
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
