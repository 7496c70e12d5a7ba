package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/tracing"
)

// Structural bounds on one request. The number of descriptors and of
// entries in each is set by Envoy's route configuration (one per rate_limits
// action), never by a client, so the bounds are generous; a request beyond
// them is OVER_LIMIT (and counted as an error), never an error that a
// failure_mode_deny: false Envoy would let through. The length of a value is
// a client's (a header, a path) and has no bound: long values are hashed
// into the store key (key.go).
const (
	maxDescriptors = 256
	maxEntries     = 64
)

// DefaultKeyPrefix starts every store key the service writes.
const DefaultKeyPrefix = "rls:"

// Options configure a Service. Store and ConfigDir are required.
type Options struct {
	// Store keeps the counters: memstore for one instance, Redis for many.
	Store sluice.Store
	// ConfigDir holds envoyproxy/ratelimit's YAML files, one domain per file.
	ConfigDir string
	// Logger receives reload and error reports. Nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the service's metrics. Nil means none are
	// exported (they are still counted).
	Registerer prometheus.Registerer
	// KeyPrefix starts every store key. Empty means DefaultKeyPrefix.
	KeyPrefix string
	// ResponseHeaders adds RateLimit, RateLimit-Policy, X-RateLimit-* and,
	// when over the limit, Retry-After to every response's
	// response_headers_to_add, for the most constrained descriptor.
	ResponseHeaders bool
	// ResponseDynamicMetadata sets every response's dynamic_metadata as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does: the domain, the
	// request's descriptors and hits_addend, and the metadata: of the rules
	// of the descriptors that passed, merged (dynamic.go).
	ResponseDynamicMetadata bool
	// Lease decides every descriptor's hot keys from capacity leased in
	// chunks (package lease; the store must be a lease.Store), as if each
	// rate_limit said `lease: true`.
	Lease bool
	// MergeDomains lets several files add to one domain, as
	// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG does. Otherwise a repeated
	// domain is a config error.
	MergeDomains bool
	// MaxDetailedSeries bounds the metric series that detailed_metric
	// descriptors create from request values. Zero means 1000.
	MaxDetailedSeries int
	// ReloadDelay is how long Watch waits after a change in ConfigDir before
	// reloading, so that a burst of writes is read once. Zero means 100ms.
	ReloadDelay time.Duration
	// ReloadStill is how long ConfigDir must see no write before a file
	// written in place is read (Watch); zero means 2s.
	ReloadStill time.Duration
	// OnReload, if set, is called after every reload that Watch triggers,
	// with its error.
	OnReload func(error)
	// Regions names every region, this instance's first, when the store
	// is a region.Store (serve's store.region and store.regions): a
	// rate_limit with `scope: global` is then one limit across the
	// regions (regions.go). Empty makes such a rule a config error.
	Regions []string
}

// Service answers Envoy's rate-limit checks from envoyproxy/ratelimit's
// configuration, charging a sluice.Store. It is safe for concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	store   sluice.Store
	dir     string
	log     *slog.Logger
	prefix  string
	headers bool
	dynamic bool
	merge   bool
	lease   bool
	delay   time.Duration
	still   time.Duration
	onLoad  func(error)
	metrics *metrics
	regions []string
	cfg     atomic.Pointer[ruleSet]

	watching func() // test hook: Watch has added its watch
}

// New loads the configuration in opts.ConfigDir and returns a Service. It
// fails if the configuration is invalid.
func New(opts Options) (*Service, error) {
	if opts.Store == nil {
		return nil, errors.New("envoyrls: Options.Store is required")
	}
	if opts.ConfigDir == "" {
		return nil, errors.New("envoyrls: Options.ConfigDir is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = DefaultKeyPrefix
	}
	if opts.ReloadDelay <= 0 {
		opts.ReloadDelay = 100 * time.Millisecond
	}
	if opts.ReloadStill <= 0 {
		opts.ReloadStill = 2 * time.Second
	}
	m, err := newMetrics(opts.Registerer, opts.MaxDetailedSeries)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: register metrics: %w", err)
	}
	s := &Service{
		store:   opts.Store,
		dir:     opts.ConfigDir,
		log:     opts.Logger,
		prefix:  opts.KeyPrefix,
		headers: opts.ResponseHeaders,
		dynamic: opts.ResponseDynamicMetadata,
		merge:   opts.MergeDomains,
		lease:   opts.Lease,
		delay:   opts.ReloadDelay,
		still:   opts.ReloadStill,
		onLoad:  opts.OnReload,
		metrics: m,
		regions: slices.Clone(opts.Regions),
	}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload reads ConfigDir again. On error the previous configuration stays
// in force.
func (s *Service) Reload() error {
	files, err := readDir(s.dir)
	return s.load(files, err)
}

// load applies files, read with err.
func (s *Service) load(files []configFile, err error) error {
	if err == nil {
		var cfg *ruleSet
		if cfg, err = parseConfig(files, s.merge, s.metrics, s.regions); err == nil {
			s.cfg.Store(cfg)
			s.metrics.loads.WithLabelValues("success").Inc()
			s.metrics.rules.Set(float64(cfg.rules))
			s.log.Info("envoyrls: configuration loaded", "dir", s.dir, "files", len(files), "domains", len(cfg.domains), "rules", cfg.rules)
			return nil
		}
	}
	s.metrics.loads.WithLabelValues("error").Inc()
	s.log.Error("envoyrls: configuration not loaded; keeping the previous one", "dir", s.dir, "error", err)
	return err
}

// Domains returns the number of domains configured.
func (s *Service) Domains() int { return len(s.cfg.Load().domains) }

// item is one request descriptor's part in a check.
type item struct {
	rule     *rule
	limit    sluice.Limit
	algo     sluice.Algorithm
	current  *rlsv3.RateLimitResponse_RateLimit
	stats    *ruleStats
	cost     int64
	kind     itemKind
	shadow   bool
	quota    bool // quota_mode (rule.quota)
	lease    bool
	key      string
	decision sluice.Decision
	decided  bool
}

type itemKind uint8

const (
	kindNone      itemKind = iota // no limit applies
	kindUnlimited                 // unlimited: true
	kindLimited                   // charged against the store
	kindCheck                     // hits_addend 0: checked, not charged
	kindDenied                    // can never pass: rate 0 or hits above capacity
)

// smallRequest is the number of descriptors a request can have for its
// per-descriptor working state to stay off the heap.
const smallRequest = 4

// errInvalid marks a malformed request.
var errInvalid = errors.New("envoyrls: invalid request")

// callSpace is the memory one check's answer and store batch take, in
// one allocation: the usual one-descriptor response with everything it
// points to, and its one store request (a larger batch is allocated: a
// Request is 144 bytes, and most checks have one descriptor). It is never
// reused (the answer outlives the call, until gRPC has marshalled it),
// only allocated with something else the call needs anyway: the gRPC
// handler allocates it with the request it decodes into (serviceCall).
type callSpace struct {
	one   oneResponse
	batch [1]sluice.Request
}

// ShouldRateLimit implements envoy.service.ratelimit.v3.RateLimitService.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.shouldRateLimit(ctx, req, new(callSpace))
}

// shouldRateLimit is ShouldRateLimit with its call's memory given.
func (s *Service) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest, space *callSpace) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.check(ctx, req, space)
	s.metrics.seconds.Observe(time.Since(start).Seconds())
	if err != nil {
		if errors.Is(err, errInvalid) {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return resp, nil
}

// check answers req; space, if not nil, holds its answer and batch.
func (s *Service) check(ctx context.Context, req *rlsv3.RateLimitRequest, space *callSpace) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, fmt.Errorf("%w: rate limit domain must not be empty", errInvalid)
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, fmt.Errorf("%w: rate limit descriptor list must not be empty", errInvalid)
	}
	cfg := s.cfg.Load()
	dom := cfg.domains[req.GetDomain()]
	dstats, domain := s.metrics.unknown, unknownDomain
	if dom != nil {
		dstats, domain = dom.stats, dom.name
	}
	if why := overBounds(descs); why != "" {
		// Fail closed: whatever else the request carries, one of its
		// descriptors may be over its limit. Checked for unknown domains
		// too, before anything is allocated per descriptor: a 4 MiB
		// message holds two million empty descriptors.
		dstats.tooLarge.Inc()
		dstats.over.Inc()
		s.log.Warn("envoyrls: request beyond the structural bounds answered OVER_LIMIT; check the route's rate_limits actions",
			"domain", domain, "problem", why)
		resp := overLimitAll(len(descs))
		if tracing.Recording(ctx) {
			traceCheck(ctx, dom, len(descs), nil, resp)
		}
		return resp, nil
	}
	// Envoy sends one to a few descriptors: their items live on the stack.
	var itemBuf [smallRequest]item
	items := itemBuf[:0]
	if len(descs) > len(itemBuf) {
		items = make([]item, 0, len(descs))
	}
	items = items[:len(descs)]
	if dom != nil {
		s.plan(dom, req, items)
	}
	resp, err := s.apply(ctx, items, space)
	if err == nil && s.dynamic {
		resp.DynamicMetadata = dynamicMetadata(req, items)
	}
	switch {
	case err != nil:
		dstats.err.Inc()
		return nil, err
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		dstats.over.Inc()
	default:
		dstats.ok.Inc()
	}
	if tracing.Recording(ctx) {
		traceCheck(ctx, dom, len(descs), items, resp)
	}
	return resp, nil
}

// overBounds describes how descs exceeds the structural bounds, or is "".
func overBounds(descs []*ratelimitv3.RateLimitDescriptor) string {
	if len(descs) > maxDescriptors {
		return fmt.Sprintf("%d descriptors, at most %d", len(descs), maxDescriptors)
	}
	for i, d := range descs {
		if n := len(d.GetEntries()); n > maxEntries {
			return fmt.Sprintf("descriptor %d has %d entries, at most %d", i, n, maxEntries)
		}
	}
	return ""
}

// overLimitAll answers OVER_LIMIT for every one of n descriptors. The
// statuses are one and the same, read-only: n pointers, not n statuses.
func overLimitAll(n int) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}
	for i := range resp.Statuses {
		resp.Statuses[i] = st
	}
	return resp
}

// plan resolves each descriptor's limit, applying replaces, and the hits
// each is charged.
func (s *Service) plan(dom *domainConfig, req *rlsv3.RateLimitRequest, items []item) {
	var replaced map[string]bool
	var matchBuf [smallRequest]match
	matches := matchBuf[:0]
	if len(items) > len(matchBuf) {
		matches = make([]match, 0, len(items))
	}
	matches = matches[:len(items)]
	for i, d := range req.GetDescriptors() {
		if o := d.GetLimit(); o != nil {
			l, ok := overrideLimit(o.GetRequestsPerUnit(), rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit()), o.GetUnitMultiplier().GetValue())
			if ok {
				items[i] = item{limit: l, algo: sluice.FixedWindow, kind: kindLimited,
					current: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit()), UnitMultiplier: o.GetUnitMultiplier()},
					stats:   dom.override}
				continue
			}
			// An unknown or missing unit, or a period out of range: the
			// configured limit stays, and the error is counted.
			dom.stats.badOverride.Inc()
		}
		matches[i] = dom.lookup(d.GetEntries())
		r := matches[i].rule
		if r == nil {
			continue
		}
		for _, name := range r.replaces {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			replaced[name] = true
		}
	}
	for i := range items {
		r := matches[i].rule
		if r == nil || (r.name != "" && replaced[r.name]) {
			continue
		}
		it := item{rule: r, limit: r.limit, algo: r.algorithm, current: r.current, stats: r.stats, shadow: r.shadow, quota: r.quota, kind: kindLimited, lease: r.lease || s.lease}
		if r.unlimited {
			it.kind = kindUnlimited
		}
		if r.detailedMetric {
			it.stats = s.detailedStats(dom.name, req.GetDescriptors()[i], r.stats)
		}
		items[i] = it
	}
	reqHits := max(1, int64(req.GetHitsAddend()))
	for i, d := range req.GetDescriptors() {
		it := &items[i]
		if it.kind != kindLimited {
			continue
		}
		it.cost = reqHits
		if h := d.GetHitsAddend(); h != nil {
			it.cost = int64(min(h.GetValue(), math.MaxInt64))
		}
		r := sluice.Request{Algorithm: it.algo, Limit: it.limit}
		switch {
		case it.limit.Rate <= 0 || it.cost > r.Capacity():
			it.kind = kindDenied
		case it.cost == 0:
			it.kind = kindCheck
		}
	}
	s.keys(dom, req, items, matches)
}

func (s *Service) detailedStats(domain string, d *ratelimitv3.RateLimitDescriptor, fallback *ruleStats) *ruleStats {
	entries := make([]entryKV, len(d.GetEntries()))
	for i, e := range d.GetEntries() {
		entries[i] = entryKV{e.GetKey(), e.GetValue()}
	}
	return s.metrics.detailedRule(domain, entries, fallback)
}

// apply charges the store and builds the response in space, if not nil
// and large enough.
func (s *Service) apply(ctx context.Context, items []item, space *callSpace) (*rlsv3.RateLimitResponse, error) {
	var batch []sluice.Request
	if space != nil && len(items) <= len(space.batch) {
		batch = space.batch[:0]
	} else {
		batch = make([]sluice.Request, 0, len(items))
	}
	var idxBuf [smallRequest]int
	idx := idxBuf[:0]
	needPeek := false
	for i := range items {
		it := &items[i]
		switch it.kind {
		case kindLimited:
			batch = append(batch, it.request())
			idx = append(idx, i)
		case kindCheck:
			needPeek = true
		case kindDenied:
			it.decision = deniedDecision(it.limit)
			it.decided = true
			if !it.shadow {
				needPeek = true // or, in quota mode, what the others say decides
			}
		}
	}
	if needPeek {
		over, err := s.peek(ctx, items)
		if err != nil {
			return nil, err
		}
		if over {
			return s.response(items, space), nil
		}
	}
	// Charge all or nothing. A batch denied only by shadow-mode descriptors,
	// or by some of its quota-mode descriptors but not all, is charged again
	// without them: neither blocks the others.
	for len(batch) > 0 {
		ds, err := s.store.ApplyAll(ctx, sluice.OpAllow, batch)
		if err != nil {
			return nil, fmt.Errorf("envoyrls: store: %w", err)
		}
		if len(ds) != len(batch) {
			return nil, fmt.Errorf("envoyrls: store: %d decisions for %d requests", len(ds), len(batch))
		}
		for j, d := range ds {
			it := &items[idx[j]]
			it.decision, it.decided = d, true
		}
		if overLimit(items) || allAllowed(ds) {
			break
		}
		n := 0
		for j, d := range ds {
			if d.Allowed {
				batch[n], idx[n] = batch[j], idx[j]
				n++
			}
		}
		batch, idx = batch[:n], idx[:n]
	}
	return s.response(items, space), nil
}

// peek asks the store, changing nothing, about every limited and
// check-only descriptor. It reports whether the request is over the limit,
// in which case nothing is to be charged and every item is decided.
func (s *Service) peek(ctx context.Context, items []item) (bool, error) {
	batch := make([]sluice.Request, 0, len(items))
	idx := make([]int, 0, len(items))
	for i := range items {
		it := &items[i]
		if it.kind == kindDenied && it.limit.Rate <= 0 {
			continue // decided by apply
		}
		if it.kind == kindLimited || it.kind == kindCheck || it.kind == kindDenied {
			r := it.request()
			if it.kind != kindLimited {
				r.Cost = 0 // check only; a denied item's state, for its counts
			}
			batch = append(batch, r)
			idx = append(idx, i)
		}
	}
	if len(batch) == 0 {
		return overLimit(items), nil
	}
	ds, err := s.store.ApplyAll(ctx, sluice.OpPeek, batch)
	if err != nil {
		return false, fmt.Errorf("envoyrls: store: %w", err)
	}
	if len(ds) != len(batch) {
		return false, fmt.Errorf("envoyrls: store: %d decisions for %d requests", len(ds), len(batch))
	}
	for j, d := range ds {
		it := &items[idx[j]]
		if it.kind == kindDenied {
			d.Allowed = false
			d.RetryAfter = max(d.RetryAfter, d.ResetAfter)
		}
		it.decision, it.decided = d, true
	}
	return overLimit(items), nil
}

// overLimit reports whether the items decided so far put the request over
// its limits, as envoyproxy/ratelimit's service decides the overall code:
// any descriptor over its limit that is in neither shadow nor quota mode,
// or every quota-mode descriptor over its limit (a quota-mode descriptor
// alone over its limit lets the request pass while another has quota
// left). Shadow-mode descriptors are never over; unlimited ones and those
// without a rule take no part.
func overLimit(items []item) bool {
	quotas, quotaOver := 0, 0
	for i := range items {
		it := &items[i]
		if it.kind == kindNone || it.kind == kindUnlimited {
			continue
		}
		over := it.decided && !it.decision.Allowed && !it.shadow
		if it.quota {
			quotas++
			if over {
				quotaOver++
			}
			continue
		}
		if over {
			return true
		}
	}
	return quotas > 0 && quotaOver == quotas
}

func allAllowed(ds []sluice.Decision) bool {
	for _, d := range ds {
		if !d.Allowed {
			return false
		}
	}
	return true
}

// deniedDecision answers for a request that can never pass.
func deniedDecision(l sluice.Limit) sluice.Decision {
	return sluice.Decision{Limit: l, RetryAfter: l.Period, ResetAfter: l.Period}
}

func (it *item) request() sluice.Request {
	return sluice.Request{Key: it.key, Algorithm: it.algo, Limit: it.limit, Cost: it.cost, UseLease: it.lease}
}

// response builds the reply from the items' decisions, in space if not
// nil.
func (s *Service) response(items []item, space *callSpace) *rlsv3.RateLimitResponse {
	var resp *rlsv3.RateLimitResponse
	var sts []rlsv3.RateLimitResponse_DescriptorStatus
	var durs []durationpb.Duration
	if len(items) == 1 {
		// The usual case in one allocation instead of four, or none.
		var one *oneResponse
		if space != nil {
			one = &space.one
		} else {
			one = new(oneResponse)
		}
		resp, sts, durs = &one.resp, one.status[:], one.reset[:]
		resp.Statuses = one.statuses[:]
	} else {
		resp = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items))}
		sts = make([]rlsv3.RateLimitResponse_DescriptorStatus, len(items))
		durs = make([]durationpb.Duration, len(items))
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	if overLimit(items) {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	for i := range items {
		it := &items[i]
		st := &sts[i]
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		switch it.kind {
		case kindNone:
			continue
		case kindUnlimited:
			st.LimitRemaining = math.MaxUint32
			it.stats.record(max(it.cost, 1), false, false, false)
			continue
		}
		d := it.decision
		st.CurrentLimit = it.current
		st.LimitRemaining = uint32(min(max(d.Remaining, 0), math.MaxUint32))
		st.DurationUntilReset = resetDuration(&durs[i], it.algo, d, it.limit.Period)
		over := !d.Allowed
		if over {
			st.LimitRemaining = 0
			if !it.shadow {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT // a quota-mode one too, as envoyproxy/ratelimit answers
			}
		}
		near := d.Allowed && it.limit.Rate > 0 && (it.limit.Rate-d.Remaining)*5 > it.limit.Rate*4
		it.stats.record(it.cost, over, it.shadow, near)
	}
	if s.headers {
		resp.ResponseHeadersToAdd = headersFor(items, resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	}
	if fb := fallbackOf(items); fb != "" {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: DegradedHeader, Value: fb})
	}
	return resp
}

// DegradedHeader is added to a response that a failure policy answered in
// part because the store could not be asked; its value names the policy,
// such as "local". Envoy adds it to the client's response.
const DegradedHeader = "sluice-degraded"

// fallbackOf names the failure policy that decided any of the items, or is
// empty when the store decided them all.
func fallbackOf(items []item) string {
	for i := range items {
		if d := &items[i].decision; items[i].decided && d.Degraded {
			if d.Fallback == "" {
				return "degraded"
			}
			return d.Fallback
		}
	}
	return ""
}

// oneResponse is a one-descriptor response with everything it points to.
type oneResponse struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	status   [1]rlsv3.RateLimitResponse_DescriptorStatus
	reset    [1]durationpb.Duration
}

// resetDuration sets out to the time until the limit is fully available
// again and returns it, in (0, unit]. For fixed windows it is rounded up to
// whole seconds, which is exactly envoyproxy/ratelimit's "unit length minus
// seconds into the window". A limit with nothing used (a check-only
// hits_addend 0 on an untouched key) reports its whole unit: the store
// does not say where in the window it is, and the window has surely turned
// by then. Longer waits (a sliding window's second unit) are capped at the
// unit.
func resetDuration(out *durationpb.Duration, a sluice.Algorithm, d sluice.Decision, unit time.Duration) *durationpb.Duration {
	reset := d.ResetAfter
	if !d.Allowed {
		reset = max(reset, d.RetryAfter)
	}
	if reset <= 0 || reset > unit {
		reset = unit
	}
	if a == sluice.FixedWindow {
		out.Seconds = sluice.CeilSeconds(reset)
		return out
	}
	// As durationpb.New.
	out.Seconds = int64(reset / time.Second)
	out.Nanos = int32(reset % time.Second)
	return out
}

// headersFor returns the rate-limit response headers of a request: one
// IETF item per enforced descriptor that was decided (shadow-mode ones
// enforce nothing), in the request's order, and the X-RateLimit-* and
// Retry-After that httplimit.SetHeaders derives from them. A descriptor is
// named by its rule's name or full key; a request's own limit override is
// "override". Names repeat when a request repeats a descriptor: the
// repeats get "#2", "#3", ... so that every item stays distinct. A
// quota-mode descriptor over its limit is left out of a request that
// passes (over is false): the request did not wait for it.
func headersFor(items []item, over bool) []*corev3.HeaderValue {
	var qbuf [smallRequest]httplimit.Quota
	qs := qbuf[:0]
	for i := range items {
		it := &items[i]
		if !it.decided || it.shadow || (it.kind != kindLimited && it.kind != kindCheck && it.kind != kindDenied) {
			continue
		}
		if it.quota && !over && !it.decision.Allowed {
			continue
		}
		name := "override"
		if it.rule != nil {
			name = it.rule.name
			if name == "" {
				name = it.rule.fullKey
			}
		}
		for n, base := 2, name; slices.ContainsFunc(qs, func(q httplimit.Quota) bool { return q.Name == name }); n++ {
			name = base + "#" + strconv.Itoa(n)
		}
		d := it.decision
		if !d.Allowed && d.RetryAfter <= 0 {
			d.RetryAfter = d.ResetAfter
		}
		qs = append(qs, httplimit.Quota{Name: name, Algorithm: it.algo, Decision: d})
	}
	if len(qs) == 0 {
		return nil
	}
	h := make(http.Header, len(httplimit.Fields))
	httplimit.SetHeaders(h, qs)
	out := make([]*corev3.HeaderValue, 0, len(h))
	for _, k := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"} {
		if v := h.Get(k); v != "" {
			out = append(out, &corev3.HeaderValue{Key: k, Value: v})
		}
	}
	return out
}

// unitSeconds formats a period for a store key.
func unitSeconds(p time.Duration) string {
	if p%time.Second == 0 {
		return strconv.FormatInt(int64(p/time.Second), 10)
	}
	return strconv.FormatInt(int64(p), 10) + "ns"
}
