package rlqs

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

// ErrConfig means the `rlqs:` section is malformed.
var ErrConfig = errors.New("rlqs: bad config")

// Defaults and bounds of the section. Each is written down in docs/envoy.md
// and asserted by a test.
const (
	// DefaultReportInterval is the filter's reporting_interval sluice
	// expects when report_interval is not set.
	DefaultReportInterval = time.Second
	// MinReportInterval is the least report_interval: Envoy rejects a
	// reporting_interval of 100 ms or less (go-control-plane's
	// rate_limit_quota.pb.validate.go: "value must be greater than 100ms").
	MinReportInterval = 100*time.Millisecond + time.Millisecond
	// DefaultMaxBucketsPerStream bounds the distinct buckets one stream
	// (one Envoy) may report.
	DefaultMaxBucketsPerStream = 1000
	// DefaultMaxStreamsPerPeer bounds the streams one client IP holds open.
	DefaultMaxStreamsPerPeer = 16
	// DefaultMaxUsagesPerReport bounds the bucket usages of one message.
	DefaultMaxUsagesPerReport = 1000
	// DefaultMaxReportsPerPeer bounds the bucket usages one client IP may
	// send per report interval, over all its streams (an Envoy sends one
	// per bucket per interval, and one more when it creates the bucket).
	DefaultMaxReportsPerPeer = 4000
	// DefaultMaxNewBucketsPerPeer bounds the buckets one client IP may
	// open per report interval, over all its streams and reconnects.
	DefaultMaxNewBucketsPerPeer = 1000
	// DefaultMaxStreams bounds the streams of the whole server where the
	// Go runtime has no memory limit; under one (GOMEMLIMIT, which
	// sluice serve sets from its cgroup), the default is
	// MaxStreamsFor(the limit).
	DefaultMaxStreams = 256
	// StreamMemory is what one stream may cost at worst under a flood of
	// the largest reports the caps let in, sent back to back: the report
	// being read (gRPC grows a stream's window to the length a message
	// announces) and its decoded copy. TestAbuseMemory measured peaks of
	// 80–108 MiB at 96 streams (once 234 MiB at 86) and 260–268 MiB at
	// 256, with the soft limit at 230 MiB; this is 3 MiB.
	StreamMemory = 3 << 20
	// DefaultMaxBuckets bounds the buckets of the whole server, over all
	// streams.
	DefaultMaxBuckets = 100000
	// MaxBucketIDEntries bounds the entries of one bucket id.
	MaxBucketIDEntries = 16
	// MaxBucketIDBytes bounds the bytes of one bucket id's keys and values.
	MaxBucketIDBytes = 1024
	// maxPolicies bounds the policies of the whole section.
	maxPolicies = 10000
	// BurstFraction is the share of an assignment's tokens per fill that
	// its Envoy bucket holds at once (max_tokens, at least MinBurst); a
	// fresh bucket starts full, and that burst is the part of the fleet
	// bound that a change of assignment adds (docs/envoy.md).
	BurstFraction = 0.02
	// MinBurst is the least max_tokens of an assignment: with one token,
	// an Envoy whose requests come faster than its refill loses the part
	// of each refill that arrives while the bucket is full.
	MinBurst = 2
	// Granularity is the least number of tokens per fill interval a
	// policy's capacity is divided in (its shares are whole tokens).
	Granularity = 100
)

// Config is the `rlqs:` section of sluice serve's configuration file: the
// Envoy quota service (RLQS) served on the `envoy:` section's gRPC port.
//
//	rlqs:
//	  report_interval: 1s        # the filter's reporting_interval
//	  assignment_ttl: 2s         # default 2 × report_interval
//	  domains:
//	    - domain: envoy
//	      policies:
//	        - name: per-user
//	          match: {route: api, user: "*"}
//	          requests_per_unit: 100
//	          unit: second
//	        - name: admin-blocked
//	          match: {route: admin}
//	          denied: true
type Config struct {
	// ReportInterval is the reporting_interval of the filter's bucket
	// settings; assignments hand out tokens per interval.
	ReportInterval time.Duration `yaml:"report_interval"`
	// AssignmentTTL is every assignment's assignment_time_to_live; default
	// twice ReportInterval, at least ReportInterval.
	AssignmentTTL time.Duration `yaml:"assignment_ttl"`
	// MaxBucketsPerStream, MaxStreamsPerPeer and MaxUsagesPerReport bound
	// what a client sends; 0 means the default.
	MaxBucketsPerStream int `yaml:"max_buckets_per_stream"`
	MaxStreamsPerPeer   int `yaml:"max_streams_per_peer"`
	MaxUsagesPerReport  int `yaml:"max_usages_per_report"`
	// MaxReportsPerPeer and MaxNewBucketsPerPeer are a client IP's budget
	// per report interval, kept across its reconnects: bucket usages
	// beyond the first are dropped unanswered (the Envoy keeps its
	// assignment), new buckets beyond the second get no assignment this
	// interval. 0 means the default.
	MaxReportsPerPeer    int `yaml:"max_reports_per_peer"`
	MaxNewBucketsPerPeer int `yaml:"max_new_buckets_per_peer"`
	// MaxStreams and MaxBuckets bound the whole server, whatever the
	// number of clients; 0 means the default.
	MaxStreams int `yaml:"max_streams"`
	MaxBuckets int `yaml:"max_buckets"`
	// Domains maps each domain (the first report's) to its policies.
	Domains []Domain `yaml:"domains"`
	// Regions names the regions of serve's store (store.region first,
	// then store.regions), set by the service's config loader, never read
	// from the file: a policy with scope global needs them, and its home
	// is one of them. Nil without regions.
	Regions []string `yaml:"-"`
}

// Domain is one domain's policies, tried in order; the first that matches
// a bucket id applies.
type Domain struct {
	Domain   string   `yaml:"domain"`
	Policies []Policy `yaml:"policies"`
}

// Policy is the limit of the buckets whose ids it matches. Every distinct
// bucket id it matches has its own counter (per-value buckets, as a
// descriptor value left empty in envoyproxy/ratelimit's config).
type Policy struct {
	// Name names the policy in metrics; required, unique in its domain.
	Name string `yaml:"name"`
	// Match: every key must be in the bucket id with this value; "*"
	// matches any value. Keys of the bucket id not named here are free.
	Match map[string]string `yaml:"match"`
	// RequestsPerUnit and Unit are the limit of each bucket, for the whole
	// fleet of Envoys (second, minute, hour or day).
	RequestsPerUnit int64  `yaml:"requests_per_unit"`
	Unit            string `yaml:"unit"`
	// Algorithm is accepted for configs written before #36 and has no
	// effect: the quota service divides the limit's rate among the Envoys
	// (docs/envoy.md), whatever the algorithm.
	Algorithm string `yaml:"algorithm"`
	// Denied denies every request of the matched buckets (blanket DENY_ALL).
	Denied bool `yaml:"denied"`
	// Scope is "regional" (the default): the policy's buckets are the
	// limit of this region's fleet. "global": the limit of the fleets of
	// every region of serve's store.regions together, each region's
	// servers leasing part of it from the home region's store (global.go).
	Scope string `yaml:"scope"`
	// Home is a global policy's home region, whose store holds the
	// regions' leases; empty: chosen per bucket by a hash of its key
	// (region.HashHome).
	Home string `yaml:"home"`
}

// policy is a checked Policy.
type policy struct {
	name      string
	match     []kv // sorted by key
	denied    bool
	limit     sluice.Limit
	algorithm sluice.Algorithm
	// fill is the fill_interval of the policy's assignments, whole
	// seconds (Envoy divides tokens_per_fill by its seconds), and
	// capacity the limit's tokens per fill: the fleet's rate, divided in
	// shares of whole tokens (at least Granularity of them, or the
	// limit's whole period).
	fill     time.Duration
	capacity int64
	// global: the limit of every region's fleet together (global.go),
	// home its home region ("" by hash).
	global bool
	home   string
}

type kv struct{ k, v string }

var units = map[string]time.Duration{"second": time.Second, "minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour}

// Check implements internal/config's Checker: it records each problem at its
// field, so the file and line are reported.
func (c *Config) Check(doc *yamlconf.Doc) {
	if c.ReportInterval < 0 || (c.ReportInterval > 0 && (c.ReportInterval < MinReportInterval || c.ReportInterval > time.Hour)) {
		doc.Addf("report_interval", "%s: must be more than 100ms (Envoy refuses a reporting_interval of 100ms or less) and at most 1h", c.ReportInterval)
	}
	if c.AssignmentTTL != 0 && (c.AssignmentTTL < c.interval() || c.AssignmentTTL > 10*c.interval() || c.AssignmentTTL%time.Second != 0) {
		doc.Addf("assignment_ttl", "%s: must be whole seconds (Envoy reads only the seconds) within [report_interval, 10 × report_interval]", c.AssignmentTTL)
	}
	for _, b := range []struct {
		name string
		v    int
	}{{"max_buckets_per_stream", c.MaxBucketsPerStream}, {"max_streams_per_peer", c.MaxStreamsPerPeer}, {"max_usages_per_report", c.MaxUsagesPerReport},
		{"max_reports_per_peer", c.MaxReportsPerPeer}, {"max_new_buckets_per_peer", c.MaxNewBucketsPerPeer}, {"max_streams", c.MaxStreams}} {
		if b.v < 0 || b.v > 100000 {
			doc.Addf(b.name, "%d: must be within [1, 100000], or 0 for the default", b.v)
		}
	}
	if c.MaxBuckets < 0 || c.MaxBuckets > 1000000 {
		doc.Addf("max_buckets", "%d: must be within [1, 1000000], or 0 for the default", c.MaxBuckets)
	}
	if len(c.Domains) == 0 {
		doc.Addf("domains", "at least one domain is required")
	}
	seen := map[string]bool{}
	n := 0
	for i, d := range c.Domains {
		p := fmt.Sprintf("domains[%d]", i)
		if d.Domain == "" {
			doc.Addf(p+".domain", "domain is required")
		} else if seen[d.Domain] {
			doc.Addf(p+".domain", "duplicate domain %q", d.Domain)
		}
		seen[d.Domain] = true
		names := map[string]bool{}
		for j, pol := range d.Policies {
			n++
			pp := fmt.Sprintf("%s.policies[%d]", p, j)
			if n > maxPolicies {
				doc.Addf(pp, "more than %d policies", maxPolicies)
				return
			}
			if pol.Name == "" {
				doc.Addf(pp+".name", "name is required (it labels the policy's metrics)")
			} else if names[pol.Name] {
				doc.Addf(pp+".name", "duplicate policy name %q in domain %q", pol.Name, d.Domain)
			}
			names[pol.Name] = true
			if _, err := compile(pol, c.Regions); err != nil {
				field, msg, _ := strings.Cut(err.Error(), ": ")
				doc.Addf(pp+"."+field, "%s", msg)
			}
		}
	}
}

// compile checks one policy, regions being serve's (Config.Regions); an
// error reads "field: problem".
func compile(p Policy, regions []string) (*policy, error) {
	if len(p.Match) == 0 {
		return nil, errors.New("match: at least one bucket id key is required")
	}
	if len(p.Match) > MaxBucketIDEntries {
		return nil, fmt.Errorf("match: more than %d keys", MaxBucketIDEntries)
	}
	out := &policy{name: p.Name, denied: p.Denied, algorithm: sluice.GCRA}
	for _, k := range slices.Sorted(maps.Keys(p.Match)) {
		if k == "" {
			return nil, errors.New("match: empty key")
		}
		v := p.Match[k]
		if v == "" {
			return nil, fmt.Errorf("match: key %q has an empty value; use \"*\" for any value", k)
		}
		out.match = append(out.match, kv{k, v})
	}
	switch strings.ToLower(p.Scope) {
	case "", "regional":
		if p.Home != "" {
			return nil, errors.New("home: only a policy with scope: global has a home")
		}
	case "global":
		if len(regions) == 0 {
			return nil, errors.New("scope: global needs serve's store.region and store.regions (docs/regions.md)")
		}
		if p.Home != "" && !slices.Contains(regions, p.Home) {
			return nil, fmt.Errorf("home: unknown region %q; %s", truncate(p.Home), yamlconf.Valid("regions", regions))
		}
		if p.Denied {
			return nil, errors.New("scope: a denied policy has no limit to hold across regions; leave it regional")
		}
		out.global, out.home = true, p.Home
	default:
		return nil, fmt.Errorf("scope: unknown scope %q; valid: regional, global", p.Scope)
	}
	if p.Denied {
		if p.RequestsPerUnit != 0 || p.Unit != "" || p.Algorithm != "" {
			return nil, errors.New("denied: a denied policy takes no requests_per_unit, unit or algorithm")
		}
		return out, nil
	}
	period, ok := units[strings.ToLower(p.Unit)]
	if !ok {
		return nil, fmt.Errorf("unit: %q: must be second, minute, hour or day", p.Unit)
	}
	if p.RequestsPerUnit <= 0 {
		return nil, fmt.Errorf("requests_per_unit: %d: must be positive (or set denied: true)", p.RequestsPerUnit)
	}
	if p.Algorithm != "" {
		a, err := sluice.ParseAlgorithm(p.Algorithm)
		if err != nil {
			return nil, fmt.Errorf("algorithm: %v", err)
		}
		if a == sluice.Concurrency {
			return nil, errors.New("algorithm: concurrency cannot be assigned as tokens")
		}
		out.algorithm = a
	}
	out.limit = sluice.Limit{Rate: p.RequestsPerUnit, Period: period}
	if problem := algo.LogRateProblem(out.algorithm, out.limit); problem != "" {
		return nil, fmt.Errorf("requests_per_unit: %s", problem)
	}
	if err := out.limit.Validate(); err != nil {
		return nil, fmt.Errorf("requests_per_unit: %v", err)
	}
	return out, nil
}

// Validate checks the section without a file (configs built in code).
func (c *Config) Validate() error {
	doc := yamlconf.New(ErrConfig, "")
	c.Check(doc)
	return doc.Err()
}

func (c *Config) interval() time.Duration {
	if c.ReportInterval > 0 {
		return c.ReportInterval
	}
	return DefaultReportInterval
}

// ttl is the assignments' time to live: whole seconds, as Envoy reads
// only assignment_time_to_live's seconds; by default twice the interval,
// rounded up.
func (c *Config) ttl() time.Duration {
	if c.AssignmentTTL > 0 {
		return c.AssignmentTTL
	}
	return (2*c.interval() + time.Second - 1).Truncate(time.Second)
}

// MaxStreamsFor is the default bound on the server's streams under a
// memory limit of limit bytes: as many as fit StreamMemory each, at least
// 16 and at most DefaultMaxStreams (230 MiB, the soft limit in a 256 MiB
// pod: 76 streams; from 768 MiB, 256).
func MaxStreamsFor(limit int64) int {
	return int(min(int64(DefaultMaxStreams), max(16, limit/StreamMemory)))
}

// defaultMaxStreams is MaxStreamsFor the Go runtime's memory limit (none:
// DefaultMaxStreams).
func defaultMaxStreams() int {
	return MaxStreamsFor(debug.SetMemoryLimit(-1))
}

func orDefault(v, d int) int {
	if v > 0 {
		return v
	}
	return d
}

// domainPolicies is a domain's compiled policies.
type domainPolicies struct {
	name     string
	policies []*policy
}

// lookup returns the first policy matching the bucket id, or nil.
func (d *domainPolicies) lookup(id map[string]string) *policy {
	for _, p := range d.policies {
		ok := true
		for _, m := range p.match {
			v, present := id[m.k]
			if !present || (m.v != "*" && m.v != v) {
				ok = false
				break
			}
		}
		if ok {
			return p
		}
	}
	return nil
}

// compileAll compiles a validated section. A gcra or token_bucket policy's
// burst is one report interval's tokens (at least 1).
func (c *Config) compileAll() (map[string]*domainPolicies, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	out := map[string]*domainPolicies{}
	for _, d := range c.Domains {
		dp := &domainPolicies{name: d.Domain}
		for _, p := range d.Policies {
			cp, err := compile(p, c.Regions)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrConfig, p.Name, err)
			}
			if !cp.denied {
				cp.fill, cp.capacity = fillOf(cp.limit)
			}
			dp.policies = append(dp.policies, cp)
		}
		out[d.Domain] = dp
	}
	return out, nil
}

// fillOf is the fill interval and the tokens per fill of a limit's
// assignments: the fewest whole seconds whose tokens are at least
// Granularity, but no longer than the limit's period (a period that is
// not whole seconds is rounded up).
func fillOf(l sluice.Limit) (time.Duration, int64) {
	period := (l.Period + time.Second - 1).Truncate(time.Second)
	secs := int64(math.Ceil(Granularity * float64(l.Period) / float64(time.Second) / float64(l.Rate)))
	fill := min(max(1, secs)*int64(time.Second), int64(period))
	return time.Duration(fill), max(1, int64(float64(l.Rate)*float64(fill)/float64(l.Period)))
}
