package gateway

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sluice-io/sluice/internal/yamlconf"
)

// Bounds of the `queue:` section.
const (
	DefaultQueueMaxPerKey  = 16
	DefaultQueueMaxPerTier = 256
	DefaultQueueMaxTotal   = 4096
	DefaultQueueMaxBytes   = 256 << 20
	maxQueueWait           = 5 * time.Minute
	maxQueueLength         = 1 << 20
	maxClassPriority       = 1000
	maxWeight              = 1e6
)

// QueueConfig is the `queue:` section: requests over a limit wait instead
// of being refused, in priority classes, fairly among keys
// (docs/QUEUEING.md). Without it, or with MaxWait zero, nothing waits.
type QueueConfig struct {
	// MaxWait bounds a request's wait; zero (the default) refuses at once,
	// as without a queue. At most 5m.
	MaxWait time.Duration `yaml:"max_wait"`
	// MaxPerKey, MaxPerTier and MaxTotal bound the waiting requests of one
	// client, of one tier and of the gateway; defaults 16, 256 and 4096.
	// A request beyond them is refused at once (429, queue_full).
	MaxPerKey  int `yaml:"max_per_key"`
	MaxPerTier int `yaml:"max_per_tier"`
	MaxTotal   int `yaml:"max_total"`
	// MaxBytes bounds the request bodies held by waiting requests
	// together; default 256 MiB. A request beyond it is refused at once.
	MaxBytes int64 `yaml:"max_bytes"`
	// Fairness is what recent usage counts when keys of one class share
	// capacity: "requests" (the default) or "tokens" (the reservation).
	Fairness string `yaml:"fairness"`
	// HalfLife is how fast recent usage is forgotten; default 10s.
	HalfLife time.Duration `yaml:"half_life"`
	// Poll is how often a request waiting for a concurrency slot freed by
	// another instance is retried; default 50ms. A slot freed by this
	// instance wakes its queue at once.
	Poll time.Duration `yaml:"poll"`
	// Classes are the priority classes by name. Tiers and keys choose one
	// with `class:`; those that do not get the lowest class.
	Classes map[string]ClassConfig `yaml:"classes"`
	// Capacity is the shared capacity of each model, across every key and
	// tier (what the upstream account allows): every request for the
	// model is charged on it too, and classes share it.
	Capacity map[string]Limits `yaml:"capacity"`
}

// ClassConfig is one entry of `queue.classes:`.
type ClassConfig struct {
	// Priority orders classes: a higher class takes the unreserved
	// capacity first.
	Priority int `yaml:"priority"`
	// Share is the percentage of each model's capacity reserved for the
	// class; other classes borrow it while the class leaves it idle.
	// Shares sum to at most 100.
	Share int `yaml:"share"`
}

// enabled reports whether the gateway needs a queue: something may wait,
// or a model has a shared capacity.
func (q *QueueConfig) enabled() bool { return q.MaxWait > 0 || len(q.Capacity) > 0 }

func (q *QueueConfig) applyDefaults() {
	if q.MaxPerKey == 0 {
		q.MaxPerKey = DefaultQueueMaxPerKey
	}
	if q.MaxPerTier == 0 {
		q.MaxPerTier = DefaultQueueMaxPerTier
	}
	if q.MaxTotal == 0 {
		q.MaxTotal = DefaultQueueMaxTotal
	}
	if q.MaxBytes == 0 {
		q.MaxBytes = DefaultQueueMaxBytes
	}
	if q.Fairness == "" {
		q.Fairness = "requests"
	}
}

// checkQueue records the problems of the `queue:` section and of the
// tiers' and keys' class and weight.
func (c *Config) checkQueue(doc *yamlconf.Doc) {
	q := &c.Queue
	q.applyDefaults()
	for _, d := range []struct {
		path string
		v    time.Duration
	}{{"queue.max_wait", q.MaxWait}, {"queue.half_life", q.HalfLife}, {"queue.poll", q.Poll}} {
		if d.v < 0 {
			doc.Addf(d.path, "%s must not be negative", d.v)
		}
	}
	if q.MaxWait > maxQueueWait {
		doc.Addf("queue.max_wait", "%s is over the %s a request may wait", q.MaxWait, maxQueueWait)
	}
	if q.Poll > 0 && q.Poll < time.Millisecond {
		doc.Addf("queue.poll", "%s must be at least 1ms", q.Poll)
	}
	for _, n := range []struct {
		path string
		v    int
	}{{"queue.max_per_key", q.MaxPerKey}, {"queue.max_per_tier", q.MaxPerTier}, {"queue.max_total", q.MaxTotal}} {
		if n.v < 0 || n.v > maxQueueLength {
			doc.Addf(n.path, "%d must be 0 to %d", n.v, maxQueueLength)
		}
	}
	if q.MaxBytes < 0 {
		doc.Addf("queue.max_bytes", "%d must not be negative", q.MaxBytes)
	}
	if q.Fairness != "requests" && q.Fairness != "tokens" {
		doc.Addf("queue.fairness", "unknown %q; valid: requests, tokens", q.Fairness)
	}
	sum := 0
	names := sortedKeys(q.Classes)
	for _, name := range names {
		cl := q.Classes[name]
		path := "queue.classes." + name
		if !nameRE.MatchString(name) {
			doc.Addf(path, "class name must be 1-128 letters, digits or _.:/-")
		}
		if cl.Share < 0 || cl.Share > 100 {
			doc.Addf(path+".share", "%d must be a percentage, 0 to 100", cl.Share)
		} else {
			sum += cl.Share
		}
		if cl.Priority < -maxClassPriority || cl.Priority > maxClassPriority {
			doc.Addf(path+".priority", "%d must be %d to %d", cl.Priority, -maxClassPriority, maxClassPriority)
		}
	}
	if sum > 100 {
		doc.Addf("queue.classes", "shares sum to %d%%; at most 100%% can be reserved", sum)
	}
	for _, model := range sortedKeys(q.Capacity) {
		path := "queue.capacity." + model
		if !nameRE.MatchString(model) {
			doc.Addf(path, "model name must be 1-128 letters, digits or _.:/-")
		}
		l := q.Capacity[model]
		l.check(doc, path, c.LeaseTTL)
		if l == (Limits{}) {
			doc.Addf(path, "no limits: set at least one of rpm, tpm, rpd or concurrency")
		}
	}
	checkClass := func(path, class string, weight float64) {
		if class != "" {
			if _, ok := q.Classes[class]; !ok {
				valid := strings.Join(names, ", ")
				if valid == "" {
					valid = "none: define queue.classes first"
				}
				doc.Addf(path+".class", "unknown class %q; valid: %s", class, valid)
			}
		}
		if weight < 0 || weight > maxWeight || math.IsNaN(weight) {
			doc.Addf(path+".weight", "%v must be 0 to %g (0 means 1)", weight, maxWeight)
		}
	}
	for _, name := range sortedKeys(c.Tiers) {
		t := c.Tiers[name]
		checkClass("tiers."+name, t.Class, t.Weight)
	}
	for i, k := range c.Keys {
		checkClass(fmt.Sprintf("keys[%d]", i), k.Class, k.Weight)
	}
}
