package envoyrls

import (
	"crypto/sha256"
	"encoding/hex"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-io/sluice"
)

// Store keys
//
// A descriptor's counter is identified, as in envoyproxy/ratelimit, by the
// domain and the request's entries (not by the configuration node that
// matched them): two values that match one key-only rule have a counter
// each. Entries matched by a share_threshold wildcard contribute the
// wildcard instead of their value, so all such values share one counter.
//
//	rls:{<domain>}:<algorithm>:<period seconds>:<key>=<value>|<key>=<value>
//
// A rule with `scope: global` puts region.GlobalPrefix before the key
// (regions.go): "@global=eu:rls:{...}..." or "@global:rls:{...}...".
//
// The algorithm and period are part of the key so that changing either in
// the configuration starts a fresh counter instead of misreading the old
// state (envoyproxy/ratelimit's keys change with the unit too).
//
// The domain is the Redis Cluster hash tag. Every key of one request must
// live in one slot for the all-or-nothing check to be one script, and a
// descriptor's key must be the same whatever other descriptors come with
// it; the domain is the only part that both holds for. A hot domain is
// therefore one slot: split traffic that outgrows a Redis node into several
// domains.
//
// '%', '=', '|', '{' and '}' are percent-escaped, so distinct entries never
// produce one key and a domain cannot end the hash tag early. A key or value
// longer than maxLiteral bytes (a client's long path or header) is charged
// like any other, under "%H" and the hex SHA-256 of its bytes: distinct
// values keep distinct counters (SHA-256 does not collide), store keys stay
// short, and no escaped literal starts with "%H". Bytes are bytes: invalid
// UTF-8 is neither refused nor replaced.

// keys fills in the store key of every item that reaches the store.
func (s *Service) keys(dom *domainConfig, req *rlsv3.RateLimitRequest, items []item, matches []match) {
	var arr [128]byte
	buf := arr[:0]
	for i := range items {
		it := &items[i]
		if it.kind == kindNone || it.kind == kindUnlimited {
			continue
		}
		buf = buf[:0]
		if it.rule != nil {
			buf = append(buf, it.rule.mark...)
		}
		buf = append(buf, s.prefix...)
		buf = append(buf, '{')
		buf = appendEscaped(buf, dom.name)
		buf = append(buf, '}', ':')
		buf = append(buf, algoCode(it.algo)...)
		buf = append(buf, ':')
		buf = append(buf, unitSeconds(it.limit.Period)...)
		buf = append(buf, ':')
		shared := matches[i].shared
		for j, e := range req.GetDescriptors()[i].GetEntries() {
			if j > 0 {
				buf = append(buf, '|')
			}
			buf = appendPart(buf, e.GetKey())
			buf = append(buf, '=')
			if j < len(shared) && shared[j] != "" {
				buf = appendPart(buf, shared[j])
			} else {
				buf = appendPart(buf, e.GetValue())
			}
		}
		it.key = string(buf)
	}
}

// algoCode abbreviates an algorithm for keys.
func algoCode(a sluice.Algorithm) string {
	switch a {
	case sluice.FixedWindow:
		return "fw"
	case sluice.GCRA:
		return "gcra"
	case sluice.TokenBucket:
		return "tb"
	case sluice.SlidingWindowCounter:
		return "swc"
	case sluice.SlidingWindowLog:
		return "swl"
	}
	return a.String()
}

const hexDigits = "0123456789ABCDEF"

// maxLiteral is the longest key or value written into a store key as it
// is; longer ones are hashed.
const maxLiteral = 128

// appendPart appends an entry's key or value: escaped, or hashed when
// longer than maxLiteral.
func appendPart(buf []byte, s string) []byte {
	if len(s) <= maxLiteral {
		return appendEscaped(buf, s)
	}
	sum := sha256.Sum256([]byte(s))
	buf = append(buf, '%', 'H')
	return hex.AppendEncode(buf, sum[:])
}

func appendEscaped(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', '=', '|', '{', '}':
			buf = append(buf, '%', hexDigits[c>>4], hexDigits[c&15])
		default:
			buf = append(buf, c)
		}
	}
	return buf
}
