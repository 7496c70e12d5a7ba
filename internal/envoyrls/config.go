package envoyrls

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
	"github.com/sluice-io/sluice/internal/yamlconf"
	"github.com/sluice-io/sluice/lease"
)

// ErrConfig means a rate-limit configuration file is malformed. A
// directory's problems come together in one *yamlconf.Error wrapping it,
// each located as the serve and gateway configs' are, with
// envoyproxy/ratelimit's message:
// "config/foo.yaml:7: descriptors[1]: duplicate descriptor composite key 'foo.key1_value1'".
var ErrConfig = errors.New("envoyrls: bad config")

// Bounds on what a configuration directory may hold.
const (
	maxConfigFiles = 1000
	maxConfigBytes = 4 << 20 // per file
	maxDepth       = 32      // nesting of descriptors
)

// validKeys are the keys envoyproxy/ratelimit accepts anywhere in a file,
// plus sluice's extensions algorithm and burst. Like envoyproxy/ratelimit,
// the check is by name only: a key valid at one level is accepted at any.
var validKeys = map[string]bool{
	"domain":            true,
	"key":               true,
	"value":             true,
	"descriptors":       true,
	"rate_limit":        true,
	"unit":              true,
	"requests_per_unit": true,
	"unlimited":         true,
	"shadow_mode":       true,
	"quota_mode":        true,
	"name":              true,
	"replaces":          true,
	"detailed_metric":   true,
	"value_to_metric":   true,
	"share_threshold":   true,
	"metadata":          true,
	// sluice extensions
	"algorithm": true,
	"burst":     true,
	"lease":     true,
	"scope":     true,
	"home":      true,
}

type yamlReplaces struct {
	Name string `yaml:"name"`
}

type yamlRateLimit struct {
	RequestsPerUnit uint32         `yaml:"requests_per_unit"`
	Unit            string         `yaml:"unit"`
	Unlimited       bool           `yaml:"unlimited"`
	Name            string         `yaml:"name"`
	Replaces        []yamlReplaces `yaml:"replaces"`
	Algorithm       string         `yaml:"algorithm"`
	Burst           uint32         `yaml:"burst"`
	Lease           bool           `yaml:"lease"`
	Scope           string         `yaml:"scope"`
	Home            string         `yaml:"home"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit"`
	Descriptors    []yamlDescriptor `yaml:"descriptors"`
	ShadowMode     bool             `yaml:"shadow_mode"`
	DetailedMetric bool             `yaml:"detailed_metric"`
	ValueToMetric  bool             `yaml:"value_to_metric"`
	ShareThreshold bool             `yaml:"share_threshold"`
	QuotaMode      bool             `yaml:"quota_mode"`
	Metadata       map[string]any   `yaml:"metadata"`
}

type yamlRoot struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
}

// rule is one configured rate_limit: immutable once loaded, shared by all
// requests that match it.
type rule struct {
	fullKey        string // "domain.key_value.subkey", as envoyproxy/ratelimit names it
	unlimited      bool
	shadow         bool
	quota          bool // quota_mode: over it denies only when every quota-mode descriptor is over
	detailedMetric bool
	name           string
	replaces       []string
	algorithm      sluice.Algorithm
	lease          bool // decide hot keys from leased capacity (package lease)
	// mark starts the store keys of a rule with `scope: global`
	// (region.GlobalPrefix of its home): one limit across regions
	// (regions.go). "" for a regional rule.
	mark    string
	limit   sluice.Limit // Rate zero: requests_per_unit 0, which denies everything
	unit    rlsv3.RateLimitResponse_RateLimit_Unit
	current *rlsv3.RateLimitResponse_RateLimit // the response's current_limit
	stats   *ruleStats
	// metadata is the descriptor's metadata:, as envoyproxy/ratelimit
	// converts it (structpb), returned in the response's dynamic metadata
	// when the descriptor passes and envoy.response_dynamic_metadata is set.
	metadata *structpb.Struct
}

// node is one level of a domain's descriptor tree.
type node struct {
	children       map[string]*node // by "key" or "key_value"
	wildcards      []string         // children keys containing '*', in file order
	rule           *rule
	shareThreshold bool
}

// domainConfig is one domain's tree.
type domainConfig struct {
	name     string
	root     node
	stats    *domainStats
	override *ruleStats // descriptors that carry their own limit
}

// ruleSet is an immutable snapshot of a configuration directory.
type ruleSet struct {
	domains map[string]*domainConfig
	rules   int
}

// unitPeriods are envoyproxy/ratelimit's window lengths (utils.UnitToDivider).
var unitPeriods = map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration{
	rlsv3.RateLimitResponse_RateLimit_SECOND: time.Second,
	rlsv3.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	rlsv3.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	rlsv3.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_MONTH:  30 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_YEAR:   365 * 24 * time.Hour,
}

// configFile is one file to load.
type configFile struct {
	name string
	data []byte
}

// ConfigPaths lists the files of a config_dir as the service reads them:
// the YAML files (*.yaml, *.yml) directly in dir, in name order, hidden
// entries (such as Kubernetes' ..data) and directories skipped, symbolic
// links to files followed.
func ConfigPaths(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: read config dir: %w", err)
	}
	var paths []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		if ext := filepath.Ext(name); ext != ".yaml" && ext != ".yml" {
			continue
		}
		path := filepath.Join(dir, name)
		fi, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("envoyrls: %s: %w", path, err)
		}
		if !fi.IsDir() {
			paths = append(paths, path)
		}
	}
	return paths, nil
}

// readDir reads the files ConfigPaths lists, bounded in size and number.
func readDir(dir string) ([]configFile, error) {
	paths, err := ConfigPaths(dir)
	if err != nil {
		return nil, err
	}
	if len(paths) > maxConfigFiles {
		return nil, fmt.Errorf("%w: %s: more than %d config files", ErrConfig, dir, maxConfigFiles)
	}
	files := make([]configFile, 0, len(paths))
	for _, path := range paths {
		fi, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("envoyrls: %s: %w", path, err)
		}
		if fi.Size() > maxConfigBytes {
			return nil, fmt.Errorf("%w: %s: file is larger than %d bytes", ErrConfig, path, maxConfigBytes)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("envoyrls: %s: %w", path, err)
		}
		files = append(files, configFile{name: path, data: data})
	}
	return files, nil
}

// loader builds a config from files.
type loader struct {
	cfg      *ruleSet
	merge    bool
	regions  []string // every region's name, this one first; nil without regions
	metrics  *metrics
	doc      *yamlconf.Doc      // the file being loaded
	problems []yamlconf.Problem // found so far, in all files
}

// fail records a problem at path (such as "descriptors[1].rate_limit.unit")
// in the file being loaded.
func (l *loader) fail(path, format string, args ...any) {
	l.doc.Addf(path, format, args...)
}

// parseConfig loads files into one config. Domains may not repeat unless
// merge is set. Every problem of every file is reported in one
// *yamlconf.Error wrapping ErrConfig, by file and then by line.
func parseConfig(files []configFile, merge bool, m *metrics, regions []string) (*ruleSet, error) {
	l := &loader{cfg: &ruleSet{domains: map[string]*domainConfig{}}, merge: merge, metrics: m, regions: regions}
	for _, f := range files {
		l.load(f.name, f.data)
	}
	if len(l.problems) > 0 {
		return nil, &yamlconf.Error{Kind: ErrConfig, Problems: l.problems}
	}
	return l.cfg, nil
}

// load checks one file in envoyproxy/ratelimit's order: YAML, then keys,
// then types, then descriptors; a stage with problems ends the file's
// check, as the later ones would only echo them.
func (l *loader) load(file string, data []byte) {
	var generic any
	doc, err := yamlconf.Decode(ErrConfig, file, data, &generic)
	if err == nil {
		l.doc = doc
		l.loadDoc(generic)
		err = doc.Err()
	}
	var ye *yamlconf.Error
	if errors.As(err, &ye) {
		l.problems = append(l.problems, ye.Problems...)
	}
}

// loadDoc loads the file decoded as generic into l.doc.
func (l *loader) loadDoc(generic any) {
	if l.doc.Len() > 0 { // a repeated YAML key
		return
	}
	l.validateKeys(generic, "", 0)
	if l.doc.Len() > 0 {
		return
	}
	var root yamlRoot
	if !l.doc.Decode(&root) {
		return
	}
	if root.Domain == "" {
		l.fail("domain", "config file cannot have empty domain")
		return
	}
	d, present := l.cfg.domains[root.Domain]
	if present && !l.merge {
		l.fail("domain", "duplicate domain '%s' in config file", root.Domain)
		return
	}
	if !present {
		d = &domainConfig{name: root.Domain, root: node{children: map[string]*node{}}}
		d.stats = l.metrics.domain(root.Domain)
		d.override = l.metrics.rule(root.Domain, root.Domain+"."+overrideRule)
		l.cfg.domains[root.Domain] = d
	}
	l.loadDescriptors(d, &d.root, root.Domain+".", "descriptors", root.Descriptors, 1)
}

// validKeyList names validKeys for messages, in a fixed order.
var validKeyList = func() string {
	keys := make([]string, 0, len(validKeys))
	for k := range validKeys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}()

// validateKeys mirrors envoyproxy/ratelimit's validateYamlKeys: every map key
// anywhere must be a known key, lists must hold maps, leaves must be
// strings, integers, booleans or null. Unknown keys are all reported; any
// other problem stops the check. It reports whether the check may go on.
func (l *loader) validateKeys(v any, path string, depth int) bool {
	if depth > 4*maxDepth {
		l.fail(path, "config error, descriptors nested deeper than %d levels", maxDepth)
		return false
	}
	check := func(k any, val any) bool {
		ks, ok := k.(string)
		p := joinPath(path, fmt.Sprint(k))
		if !ok {
			l.fail(p, "config error, key is not of type string: %v", k)
			return false
		}
		if !validKeys[ks] {
			l.fail(p, "config error, unknown key '%s'; valid: %s", ks, validKeyList)
			return true
		}
		if ks == "metadata" {
			// As envoyproxy/ratelimit: metadata's keys and values are the
			// user's own; what cannot become a protobuf Struct is refused
			// when the descriptor is loaded.
			return true
		}
		switch val := val.(type) {
		case []any:
			for i, e := range val {
				ep := fmt.Sprintf("%s[%d]", p, i)
				switch e.(type) {
				case map[string]any, map[any]any:
				default:
					l.fail(ep, "config error, yaml file contains list of type other than map: %v", e)
					return false
				}
				if !l.validateKeys(e, ep, depth+1) {
					return false
				}
			}
		case map[string]any, map[any]any:
			return l.validateKeys(val, p, depth+1)
		case string, int, bool, nil:
		default:
			l.fail(p, "error checking config")
			return false
		}
		return true
	}
	switch m := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys) // deterministic error messages
		for _, k := range keys {
			if !check(k, m[k]) {
				return false
			}
		}
	case map[any]any:
		for k, val := range m {
			if !check(k, val) {
				return false
			}
		}
	}
	return true
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// loadDescriptors adds descs, found at path, under parent. A descriptor's
// problem is recorded and the others are still checked; only nesting too
// deep stops the walk.
func (l *loader) loadDescriptors(d *domainConfig, parent *node, parentKey, path string, descs []yamlDescriptor, depth int) bool {
	if depth > maxDepth {
		l.fail(path, "descriptors nested deeper than %d levels", maxDepth)
		return false
	}
	for i, dc := range descs {
		p := fmt.Sprintf("%s[%d]", path, i)
		if dc.Key == "" {
			l.fail(p+".key", "descriptor has empty key")
			continue
		}
		finalKey := dc.Key
		if dc.Value != "" {
			finalKey += "_" + dc.Value
		}
		fullKey := parentKey + finalKey
		if _, present := parent.children[finalKey]; present {
			l.fail(p, "duplicate descriptor composite key '%s'", fullKey)
			continue
		}
		var r *rule
		if rl := dc.RateLimit; rl != nil {
			r = l.rule(d, dc, fullKey, p+".rate_limit") // nil on a problem; check the rest
		}
		wildcard := strings.Contains(finalKey, "*")
		if dc.ShareThreshold && !wildcard {
			l.fail(p+".share_threshold", "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", finalKey)
		}
		n := &node{children: map[string]*node{}, rule: r, shareThreshold: dc.ShareThreshold}
		if !l.loadDescriptors(d, n, fullKey+".", p+".descriptors", dc.Descriptors, depth+1) {
			return false
		}
		parent.children[finalKey] = n
		if wildcard {
			parent.wildcards = append(parent.wildcards, finalKey)
		}
	}
	return true
}

// rule builds the rate_limit found at path, or records its first problem
// and returns nil.
func (l *loader) rule(d *domainConfig, dc yamlDescriptor, fullKey, path string) *rule {
	rl := dc.RateLimit
	unitValue, present := rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(rl.Unit)]
	unit := rlsv3.RateLimitResponse_RateLimit_Unit(unitValue)
	validUnit := present && unit != rlsv3.RateLimitResponse_RateLimit_UNKNOWN
	if rl.Unlimited {
		if validUnit {
			l.fail(path+".unit", "should not specify rate limit unit when unlimited")
			return nil
		}
	} else if !validUnit {
		l.fail(path+".unit", "invalid rate limit unit '%s'; valid: second, minute, hour, day, week, month, year", rl.Unit)
		return nil
	}
	r := &rule{
		fullKey:        fullKey,
		unlimited:      rl.Unlimited,
		shadow:         dc.ShadowMode,
		quota:          dc.QuotaMode,
		detailedMetric: dc.DetailedMetric,
		name:           rl.Name,
		algorithm:      sluice.FixedWindow,
		unit:           unit,
	}
	if len(dc.Metadata) > 0 {
		md, err := structpb.NewStruct(dc.Metadata)
		if err != nil {
			// protobuf-go writes a space or a no-break space after
			// "proto:" at random per binary (internal/detrand), so that
			// nobody matches its text; the operator's message is ours
			// to keep stable.
			l.fail(strings.TrimSuffix(path, ".rate_limit")+".metadata", "error parsing metadata: %s", strings.ReplaceAll(err.Error(), "\u00a0", " "))
			return nil
		}
		r.metadata = md
	}
	for i, rep := range rl.Replaces {
		if rep.Name == "" {
			l.fail(fmt.Sprintf("%s.replaces[%d].name", path, i), "should not have an empty replaces entry")
			return nil
		}
		if rep.Name == rl.Name {
			l.fail(fmt.Sprintf("%s.replaces[%d].name", path, i), "replaces should not contain name of same descriptor")
			return nil
		}
		r.replaces = append(r.replaces, rep.Name)
	}
	if rl.Algorithm != "" {
		a, err := sluice.ParseAlgorithm(rl.Algorithm)
		if err != nil {
			l.fail(path+".algorithm", "%v", err)
			return nil
		}
		if a == sluice.Concurrency {
			l.fail(path+".algorithm", "algorithm concurrency needs a release and cannot serve Envoy's checks")
			return nil
		}
		r.algorithm = a
	}
	if rl.Lease && !lease.Leasable(r.algorithm) {
		l.fail(path+".lease", "algorithm %s cannot be leased", r.algorithm)
		return nil
	}
	r.lease = rl.Lease
	if !rl.Unlimited {
		r.limit = sluice.Limit{Rate: int64(rl.RequestsPerUnit), Period: unitPeriods[unit], Burst: int64(rl.Burst)}
		if rl.Burst > 0 && r.algorithm != sluice.GCRA && r.algorithm != sluice.TokenBucket {
			l.fail(path+".burst", "burst needs algorithm gcra or token_bucket, not %s", r.algorithm)
			return nil
		}
		if problem := algo.LogRateProblem(r.algorithm, r.limit); problem != "" {
			l.fail(path+".requests_per_unit", "%s", problem)
			return nil
		}
		if r.limit.Rate > 0 {
			if err := r.limit.Validate(); err != nil {
				l.fail(path, "%v", err)
				return nil
			}
		}
		r.current = &rlsv3.RateLimitResponse_RateLimit{Name: rl.Name, RequestsPerUnit: rl.RequestsPerUnit, Unit: unit}
	}
	if !l.scope(r, rl, path) { // regions.go
		return nil
	}
	r.stats = l.metrics.rule(d.name, fullKey)
	l.cfg.rules++
	return r
}

// match is the result of looking a request descriptor up.
type match struct {
	rule *rule
	// shared holds, per entry, the wildcard value that stands for the
	// entry's value in the store key (share_threshold), or "".
	shared []string
}

// lookup finds the rule for a descriptor's entries, exactly as
// envoyproxy/ratelimit's GetLimit does: at each level try key_value, then
// the wildcards in file order, then key alone; a rule applies only if it
// sits at the level of the last entry.
func (d *domainConfig) lookup(entries []*ratelimitv3.RateLimitDescriptor_Entry) match {
	var m match
	cur := &d.root
	var arr [128]byte
	buf := arr[:0]
	for i, e := range entries {
		buf = append(append(append(buf[:0], e.GetKey()...), '_'), e.GetValue()...)
		next := cur.children[string(buf)]
		wildcard := ""
		if next == nil {
			for _, w := range cur.wildcards {
				if globMatch(w, string(buf)) {
					next, wildcard = cur.children[w], w
					break
				}
			}
		}
		if next == nil {
			next = cur.children[e.GetKey()]
		}
		if next == nil {
			break
		}
		if wildcard != "" && next.shareThreshold {
			if m.shared == nil {
				m.shared = make([]string, len(entries))
			}
			m.shared[i] = strings.TrimPrefix(wildcard, e.GetKey()+"_")
		}
		if next.rule != nil && i == len(entries)-1 {
			m.rule = next.rule
		}
		if len(next.children) == 0 {
			break
		}
		cur = next
	}
	return m
}

// globMatch reports whether s matches pattern, in which each '*' stands for
// any run of characters. A trailing '*' is envoyproxy/ratelimit's prefix
// match.
func globMatch(pattern, s string) bool {
	first, rest, ok := strings.Cut(pattern, "*")
	if !ok {
		return pattern == s
	}
	if !strings.HasPrefix(s, first) {
		return false
	}
	s = s[len(first):]
	for {
		var part string
		part, rest, ok = strings.Cut(rest, "*")
		if !ok {
			return strings.HasSuffix(s, part) // last segment anchors at the end
		}
		i := strings.Index(s, part)
		if i < 0 {
			return false
		}
		s = s[i+len(part):]
	}
}

// overrideLimit converts a request descriptor's limit override.
func overrideLimit(requestsPerUnit uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, multiplier uint32) (sluice.Limit, bool) {
	p, ok := unitPeriods[unit]
	if !ok {
		return sluice.Limit{}, false
	}
	if multiplier > 1 {
		if uint64(multiplier) > uint64(math.MaxInt64/int64(p)) {
			return sluice.Limit{}, false
		}
		p *= time.Duration(multiplier)
	}
	l := sluice.Limit{Rate: int64(requestsPerUnit), Period: p}
	if l.Rate > 0 && l.Validate() != nil {
		return sluice.Limit{}, false
	}
	return l, true
}
