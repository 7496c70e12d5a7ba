package aitoken

import (
	"sync"
	"sync/atomic"
)

// minCachedBytes is the smallest message a Cache remembers: a shorter one
// costs little more to tokenize than to look up.
const minCachedBytes = 512

// DefaultCacheEntries bounds a Cache made with NewCache(0): about 100
// bytes an entry.
const DefaultCacheEntries = 8192

// Cache remembers the exact token counts of chat messages of at least 512
// bytes, by the SHA-256 of their JSON (so no message can be made to pass
// for another), for Counter.PromptTokensCached. It holds at most its
// bound of entries, dropping an arbitrary one when full. It is safe for
// concurrent use.
type Cache struct {
	mu   sync.Mutex
	m    map[cacheKey]cacheVal
	max  int
	hits atomic.Uint64
}

type cacheKey struct {
	enc Encoding
	sum [32]byte
}

type cacheVal struct {
	tokens   int64
	consumed int // bytes of MaxExactBytes the message used
}

// NewCache returns a Cache of at most max entries; 0 means
// DefaultCacheEntries.
func NewCache(max int) *Cache {
	if max <= 0 {
		max = DefaultCacheEntries
	}
	return &Cache{m: make(map[cacheKey]cacheVal), max: max}
}

// Hits returns how many message counts the Cache has answered.
func (c *Cache) Hits() uint64 { return c.hits.Load() }

// Len returns the number of entries.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

func (c *Cache) get(k cacheKey) (cacheVal, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	return v, ok
}

func (c *Cache) put(k cacheKey, v cacheVal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		for old := range c.m {
			delete(c.m, old)
			break
		}
	}
	c.m[k] = v
}
