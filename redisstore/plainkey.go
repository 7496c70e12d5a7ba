package redisstore

import (
	"strconv"
	"strings"
	"sync"

	"github.com/sluice-io/sluice"
)

// Names of the per-window keys of Options.PlainWindows.
//
// A fixed window's count lives in base..":"..START, START its start in
// Unix ns. The base keeps the key's Redis Cluster hash slot, so that the
// window keys live on the node NodeOf names and batches stay in one slot,
// and the three forms start differently, so that no two keys share a base:
//
//	fw:KEY          KEY has a hash tag ({...}, not empty)
//	fw{KEY}         KEY has none and no '}': the tag is KEY, the same slot
//	fw%{N}KEY       otherwise: N is a decimal number whose slot is KEY's
//
// Each form maps back to its key, and START holds no ':', so the window
// keys of two keys never meet.

// hasTag reports whether key has a Redis Cluster hash tag.
func hasTag(key string) bool {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		return strings.IndexByte(key[i+1:], '}') > 0
	}
	return false
}

// plainBase is key's base name in the per-window layout.
func (c *core) plainBase(key string) string {
	return string(c.appendPlainBase(make([]byte, 0, len(key)+12), key))
}

// appendPlainBase appends key's base name in the per-window layout to b:
// the plain path builds a window's key in one buffer, and one allocation.
func (c *core) appendPlainBase(b []byte, key string) []byte {
	switch {
	case hasTag(key):
		b = append(b, "fw:"...)
		return append(b, key...)
	case strings.IndexByte(key, '}') < 0:
		b = append(b, "fw{"...)
		b = append(b, key...)
		return append(b, '}')
	}
	b = append(b, "fw%{"...)
	b = append(b, c.slotTags()[keySlot(key)]...)
	b = append(b, '}')
	return append(b, key...)
}

// slotTagTable holds, for each hash slot, the smallest decimal number
// whose slot it is, computed once on first use (about 170k CRCs).
type slotTagTable struct {
	once sync.Once
	tags *[16384]string
}

func (c *core) slotTags() *[16384]string {
	c.tagTable.once.Do(func() {
		var t [16384]string
		for n, left := 0, len(t); left > 0; n++ {
			s := strconv.Itoa(n)
			if k := keySlot(s); t[k] == "" {
				t[k] = s
				left--
			}
		}
		c.tagTable.tags = &t
	})
	return c.tagTable.tags
}

// plainLayout reports whether req's count lives in per-window keys: a
// fixed window, not a calendar one, on a store with Options.PlainWindows.
func (c *core) plainLayout(req *sluice.Request) bool {
	return c.plainOn && req.Algorithm == sluice.FixedWindow && req.Limit.Calendar.IsZero()
}

// scriptKey is the name the scripts are given for req: its base name in
// the per-window layout, else its key.
func (c *core) scriptKey(req *sluice.Request) string {
	if c.plainLayout(req) {
		return c.plainBase(req.Key)
	}
	return req.Key
}
