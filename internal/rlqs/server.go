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
// Each bucket's capacity is the store's: for every report the service
// takes the tokens of the next interval from the store (Store.Apply with
// OpAllow on the policy's limit and the bucket's key), so several sluice
// instances on one Redis divide one budget, and the store decides what is
// left. How much a stream asks for is its share of the fleet's demand:
// each report adds the stream's arrivals (allowed + denied) to a second
// store key, a sliding window two intervals long, whose count is the
// fleet's demand; a stream asks for capacity × its demand / fleet demand
// when the fleet wants more than the capacity, and its demand plus half
// again when not. A stream that gets nothing is told to deny all until the
// next report.
//
// The bound (docs/envoy.md): an assignment of g tokens per interval is a
// bucket of max_tokens ⌈g·BurstFraction⌉ filled at g per interval, so a
// fresh bucket admits at most its burst more than the store gave it per
// interval; a stream that breaks keeps its last assignment until its TTL,
// AssignmentTTL − ReportInterval longer than the store paid for.
package rlqs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// demandRate is the demand key's limit: far above any count, so it only counts.
const demandRate = 1 << 40

// overask is how much more than its share of a contested bucket a stream
// asks the store for.
const overask = 1.25

// Options configures a Server.
type Options struct {
	// Store holds the capacity; required.
	Store sluice.Store
	// Config is the `rlqs:` section; required.
	Config *Config
	// Prefix is put before every store key; default "rlqs:".
	Prefix string
	// Clock numbers the report intervals of the demand count; default the
	// system clock. Instances sharing a store must agree on the time to a
	// fraction of the report interval (NTP does).
	Clock clock.Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil means none are exported.
	Registerer prometheus.Registerer
}

// Server serves StreamRateLimitQuotas. It is safe for concurrent use.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	store    sluice.Store
	domains  map[string]*domainPolicies
	interval time.Duration
	ttl      time.Duration
	maxBkts  int
	maxPeer  int
	maxUsage int
	prefix   string
	clock    clock.Clock
	log      *slog.Logger
	m        *metrics

	mu    sync.Mutex
	peers map[string]int // open streams per client IP

	done     chan struct{} // closed by Drain
	drainOne sync.Once
}

// New validates opts and returns a Server.
func New(opts Options) (*Server, error) {
	if opts.Store == nil || opts.Config == nil {
		return nil, errors.New("rlqs: Options.Store and Options.Config are required")
	}
	domains, err := opts.Config.compileAll()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{
		store:    opts.Store,
		domains:  domains,
		interval: opts.Config.interval(),
		ttl:      opts.Config.ttl(),
		maxBkts:  orDefault(opts.Config.MaxBucketsPerStream, DefaultMaxBucketsPerStream),
		maxPeer:  orDefault(opts.Config.MaxStreamsPerPeer, DefaultMaxStreamsPerPeer),
		maxUsage: orDefault(opts.Config.MaxUsagesPerReport, DefaultMaxUsagesPerReport),
		prefix:   opts.Prefix,
		clock:    opts.Clock,
		log:      opts.Logger,
		m:        m,
		peers:    map[string]int{},
		done:     make(chan struct{}),
	}
	if s.prefix == "" {
		s.prefix = "rlqs:"
	}
	if s.clock == nil {
		s.clock = clock.NewSystem()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s, nil
}

// Register adds the service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { rlqsv3.RegisterRateLimitQuotaServiceServer(g, s) }

// Drain ends every stream, now and from now on, with UNAVAILABLE: Envoy
// reconnects, to another instance behind its cluster, and keeps its
// assignments until they expire meanwhile. sluice serve calls it before
// its graceful stop, which would otherwise wait for the streams forever.
func (s *Server) Drain() { s.drainOne.Do(func() { close(s.done) }) }

// ErrDegraded means the store answered without its backend (a guard's
// failure policy): no capacity is assigned from such an answer.
var ErrDegraded = errors.New("rlqs: store degraded")

// Errors of a stream, as gRPC statuses.
var (
	errTooManyStreams = status.Error(codes.ResourceExhausted, "rlqs: too many streams from this client")
	errNoDomain       = status.Error(codes.InvalidArgument, "rlqs: the first report must name the domain")
	errDraining       = status.Error(codes.Unavailable, "rlqs: sluice is shutting down; reconnect")
)

// bucket is one bucket id's state on one stream.
type bucket struct {
	key    string // store key part: domain, policy and hash of the id
	policy *policy
	last   int64 // tokens assigned for the current interval, not yet settled
	prev   int64 // the assignment before, for the rebalance count
	fleet  int64 // the fleet's demand in the last readable interval
}

// StreamRateLimitQuotas implements the service: one Envoy's stream.
func (s *Server) StreamRateLimitQuotas(stream grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	ctx := stream.Context()
	host := peerHost(ctx)
	if !s.acquire(host) {
		s.m.refused.WithLabelValues("streams_per_peer").Inc()
		return errTooManyStreams
	}
	defer s.release(host)
	var dom *domainPolicies
	buckets := map[string]*bucket{}
	type recv struct {
		msg *rlqsv3.RateLimitQuotaUsageReports
		err error
	}
	// Recv runs on its own so that Drain can end the stream; it ends when
	// the handler returns, as that cancels the stream.
	msgs := make(chan recv)
	go func() {
		for {
			msg, err := stream.Recv()
			select {
			case msgs <- recv{msg, err}:
			case <-ctx.Done():
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
		msg, err := r.msg, r.err
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if dom == nil {
			if msg.GetDomain() == "" {
				return errNoDomain
			}
			dom = s.domains[msg.GetDomain()]
			if dom == nil {
				s.m.refused.WithLabelValues("unknown_domain").Inc()
				return status.Errorf(codes.NotFound, "rlqs: domain %q is not configured", truncate(msg.GetDomain()))
			}
			s.m.streams.WithLabelValues(dom.name).Inc()
			defer s.m.streams.WithLabelValues(dom.name).Dec()
		}
		usages := msg.GetBucketQuotaUsages()
		if len(usages) > s.maxUsage {
			s.m.refused.WithLabelValues("usages_per_report").Inc()
			return status.Errorf(codes.ResourceExhausted, "rlqs: %d bucket usages in one report; at most %d", len(usages), s.maxUsage)
		}
		resp := &rlqsv3.RateLimitQuotaResponse{}
		for _, u := range usages {
			id := u.GetBucketId().GetBucket()
			if err := checkID(id); err != nil {
				s.m.refused.WithLabelValues("bucket_id").Inc()
				return err
			}
			canon := canonical(id)
			b := buckets[canon]
			if b == nil {
				if len(buckets) >= s.maxBkts {
					s.m.refused.WithLabelValues("buckets_per_stream").Inc()
					return status.Errorf(codes.ResourceExhausted, "rlqs: more than %d buckets on one stream", s.maxBkts)
				}
				b = &bucket{}
				buckets[canon] = b
			}
			if p := dom.lookup(id); p != b.policy || b.key == "" {
				b.policy, b.last, b.prev, b.fleet = p, 0, 0, 0
				if p != nil {
					b.key = s.prefix + dom.name + ":" + p.name + ":{" + hashID(canon) + "}"
				}
			}
			if a := s.act(ctx, dom.name, b, u); a != nil {
				a.BucketId = u.GetBucketId()
				resp.BucketAction = append(resp.BucketAction, a)
			}
		}
		if len(resp.BucketAction) == 0 {
			continue
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// act decides one bucket's action for its usage report; nil leaves the
// stream's current assignment in place (the store did not answer).
func (s *Server) act(ctx context.Context, domain string, b *bucket, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	p := b.policy
	if p == nil {
		s.m.assignments.WithLabelValues(domain, "", "abandon").Inc()
		return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
	}
	s.m.reports.WithLabelValues(domain, p.name).Inc()
	if p.denied {
		s.m.assignments.WithLabelValues(domain, p.name, "deny").Inc()
		return s.blanket(typev3.RateLimitStrategy_DENY_ALL)
	}
	// The stream's demand per interval, from what it saw.
	elapsed := u.GetTimeElapsed().AsDuration()
	if elapsed <= 0 {
		elapsed = s.interval
	}
	arrivals := float64(u.GetNumRequestsAllowed()) + float64(u.GetNumRequestsDenied())
	mine := int64(math.Ceil(arrivals * float64(s.interval) / float64(elapsed)))
	capacity := max(1, int64(float64(p.limit.Rate)*float64(s.interval)/float64(p.limit.Period)))
	mine = min(mine, 4*capacity) // one stream cannot claim more than it could use
	sctx, cancel := context.WithTimeout(ctx, s.interval/2)
	defer cancel()
	if b.last > 0 {
		// Tokens assigned for the last interval and not spent go back, so
		// that the streams that want them can take them now. Once: a
		// refund that timed out may still be applied when the store comes
		// back, so it is never sent again.
		unused := b.last - int64(u.GetNumRequestsAllowed())
		b.last = 0
		if unused > 0 {
			if err := s.refund(sctx, b.key, p, unused); err != nil {
				s.m.storeErrors.WithLabelValues(domain, p.name).Inc()
				return nil
			}
		}
	}
	raw, fresh, err := s.demand(sctx, b.key, mine)
	if err != nil {
		s.m.storeErrors.WithLabelValues(domain, p.name).Inc()
		s.log.Warn("rlqs: store: demand", "domain", domain, "policy", p.name, "err", err)
		return nil
	}
	if fresh {
		b.fleet = raw
	}
	fleet := max(mine, b.fleet)
	var want int64
	if fleet > capacity {
		// The stream's share, asked a quarter over: the fleet estimate
		// lags, and the store caps what all take together.
		want = int64(math.Ceil(overask * float64(capacity) * float64(mine) / float64(fleet)))
	} else {
		want = mine + mine/2 + 1 // room to grow until the next report
	}
	want = max(1, min(want, capacity))
	got, err := s.take(sctx, b.key, p, want)
	if err != nil {
		s.m.storeErrors.WithLabelValues(domain, p.name).Inc()
		s.log.Warn("rlqs: store: take", "domain", domain, "policy", p.name, "err", err)
		return nil
	}
	if b.prev > 0 && math.Abs(float64(got-b.prev)) > 0.1*float64(b.prev) {
		s.m.rebalances.WithLabelValues(domain, p.name).Inc()
	}
	b.last, b.prev = got, got
	if got == 0 {
		s.m.assignments.WithLabelValues(domain, p.name, "deny").Inc()
		return s.blanket(typev3.RateLimitStrategy_DENY_ALL)
	}
	s.m.assignments.WithLabelValues(domain, p.name, "tokens").Inc()
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(s.ttl),
			RateLimitStrategy:    TokenBucketFor(got, s.interval),
		}}}
}

// TokenBucketFor is the strategy of an assignment of g tokens per interval:
// a bucket of ⌈g·BurstFraction⌉ tokens refilled with g every interval.
func TokenBucketFor(g int64, interval time.Duration) *typev3.RateLimitStrategy {
	g = min(g, math.MaxUint32)
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(max(1, math.Ceil(float64(g)*BurstFraction))),
		TokensPerFill: wrapperspb.UInt32(uint32(g)),
		FillInterval:  durationpb.New(interval),
	}}}
}

func (s *Server) blanket(r typev3.RateLimitStrategy_BlanketRule) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(s.ttl),
			RateLimitStrategy:    &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}},
		}}}
}

// demandWindows is how many report intervals one window of the demand
// keys' store counter spans.
const demandWindows = 8

// demand adds the stream's demand to the count of the current report
// interval and returns the fleet's demand per interval over the two
// intervals before, in which every stream reported about twice: a sum,
// not a sliding estimate whose error depends on the order of the reports.
// ok is false when those counts are not readable (their store window has
// ended; two intervals in demandWindows).
func (s *Server) demand(ctx context.Context, key string, mine int64) (fleet int64, ok bool, err error) {
	n := s.clock.Now() / int64(s.interval)
	lim := sluice.Limit{Rate: demandRate, Period: demandWindows * s.interval}
	reqs := []sluice.Request{
		{Key: fmt.Sprintf("%s:demand:%d", key, n-1), Algorithm: sluice.FixedWindow, Limit: lim},
		{Key: fmt.Sprintf("%s:demand:%d", key, n-2), Algorithm: sluice.FixedWindow, Limit: lim},
	}
	if mine > 0 {
		d, err := s.store.Apply(ctx, sluice.OpAllow, sluice.Request{Key: fmt.Sprintf("%s:demand:%d", key, n), Algorithm: sluice.FixedWindow, Limit: lim, Cost: mine})
		if err == nil && d.Degraded {
			err = ErrDegraded
		}
		if err != nil {
			return 0, false, fmt.Errorf("rlqs: demand: %w", err)
		}
	}
	if n%demandWindows < 2 {
		return 0, false, nil
	}
	ds, err := s.store.ApplyAll(ctx, sluice.OpPeek, reqs)
	if err == nil && (ds[0].Degraded || ds[1].Degraded) {
		err = ErrDegraded
	}
	if err != nil {
		return 0, false, fmt.Errorf("rlqs: demand: %w", err)
	}
	return (2*demandRate - ds[0].Remaining - ds[1].Remaining) / 2, true, nil
}

// take takes up to want tokens of the bucket's limit from the store and
// returns how many it got: what is left, when less than want. A decision
// the store made without its backend (Degraded, a guard's failure policy)
// is no capacity: it is an error.
func (s *Server) take(ctx context.Context, key string, p *policy, want int64) (int64, error) {
	req := sluice.Request{Key: key, Algorithm: p.algorithm, Limit: p.limit}
	d, err := s.store.Apply(ctx, sluice.OpPeek, req)
	if err == nil && d.Degraded {
		err = ErrDegraded
	}
	if err != nil {
		return 0, fmt.Errorf("rlqs: take: %w", err)
	}
	req.Cost = min(want, d.Remaining)
	if req.Cost <= 0 {
		return 0, nil
	}
	d, err = s.store.Apply(ctx, sluice.OpAllow, req)
	if err == nil && d.Degraded {
		err = ErrDegraded
	}
	if err != nil {
		return 0, fmt.Errorf("rlqs: take: %w", err)
	}
	if !d.Allowed {
		return 0, nil // another instance took it meanwhile
	}
	return req.Cost, nil
}

// refund gives n unspent tokens back to the bucket's limit.
func (s *Server) refund(ctx context.Context, key string, p *policy, n int64) error {
	_, err := s.store.Apply(ctx, sluice.OpRefund, sluice.Request{Key: key, Algorithm: p.algorithm, Limit: p.limit, Cost: n})
	if err != nil {
		return fmt.Errorf("rlqs: refund: %w", err)
	}
	return nil
}

func (s *Server) acquire(host string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peers[host] >= s.maxPeer {
		return false
	}
	s.peers[host]++
	return true
}

func (s *Server) release(host string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peers[host]--; s.peers[host] <= 0 {
		delete(s.peers, host)
	}
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
func canonical(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "%d:%s%d:%s", len(k), k, len(id[k]), id[k])
	}
	return sb.String()
}

// hashID keeps raw bucket values (user ids, perhaps) out of store keys.
func hashID(canon string) string {
	h := sha256.Sum256([]byte(canon))
	return hex.EncodeToString(h[:12])
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
