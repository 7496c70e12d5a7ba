package gateway

// A usage object decoded without encoding/json, for the shape upstreams
// send (settlement reads one per JSON response: findUsage).

// decodeUsage decodes the usage object b (from its '{' to its '}', as
// objectLen cuts it) into u, which must be zero, and reports whether it
// did. It reads only what json.Unmarshal reads the same way: member names
// of lower-case ASCII letters, digits and '_' without escapes (so a name
// matches a field exactly or no field at all, as encoding/json's
// case-insensitive matching would have it), each field once, unsigned
// integers of up to 18 digits for the numbers, objects for the details,
// and for members it does not know integers, true, false, null, strings
// without escapes or control bytes and objects of the same. For anything
// else (an array, a fraction, a negative number, a null field, a name in
// another case, a repeated field, nesting past maxUsageDepth) it reports
// false, leaving u partly written, and the caller decodes b with
// json.Unmarshal instead. FuzzFindUsage holds findUsage, which tries it
// first, to the decoder's reading of the same bytes.
//
// encoding/json decoded the usage object of a completion in about 0.7 µs
// alone, and 2.8 µs per request in the settlement's goroutine, whose
// stack it grew (BenchmarkServeHTTPLeased's profile: findUsage was 60% of
// settle).
func decodeUsage(b []byte, u *usageJSON) bool {
	d := usageDecoder{jsonScan{b: b}}
	var seen uint16
	ok := d.object(func(name []byte) bool {
		var bit uint16
		var dst *int64
		var details **tokenDetails
		switch string(name) {
		case "prompt_tokens":
			bit, dst = 1<<0, &u.PromptTokens
		case "completion_tokens":
			bit, dst = 1<<1, &u.CompletionTokens
		case "input_tokens":
			bit, dst = 1<<2, &u.InputTokens
		case "output_tokens":
			bit, dst = 1<<3, &u.OutputTokens
		case "total_tokens":
			bit, dst = 1<<4, &u.TotalTokens
		case "cache_creation_input_tokens":
			bit, dst = 1<<5, &u.CacheCreationInputTokens
		case "cache_read_input_tokens":
			bit, dst = 1<<6, &u.CacheReadInputTokens
		case "prompt_tokens_details":
			bit, details = 1<<7, &u.PromptTokensDetails
		case "completion_tokens_details":
			bit, details = 1<<8, &u.CompletionTokensDetails
		case "input_tokens_details":
			bit, details = 1<<9, &u.InputTokensDetails
		case "output_tokens_details":
			bit, details = 1<<10, &u.OutputTokensDetails
		case "cache_creation":
			if seen&(1<<11) != 0 {
				return false
			}
			seen |= 1 << 11
			cc := &cacheCreationJSON{}
			u.CacheCreation = cc
			return d.counts(func(name []byte) *int64 {
				switch string(name) {
				case "ephemeral_5m_input_tokens":
					return &cc.Ephemeral5m
				case "ephemeral_1h_input_tokens":
					return &cc.Ephemeral1h
				}
				return nil
			})
		default:
			return plainName(name) && d.skip(1)
		}
		if seen&bit != 0 {
			return false // repeated: encoding/json merges or overwrites
		}
		seen |= bit
		if dst != nil {
			var ok bool
			*dst, ok = d.uint()
			return ok
		}
		td := &tokenDetails{}
		*details = td
		return d.counts(func(name []byte) *int64 {
			switch string(name) {
			case "cached_tokens":
				return &td.CachedTokens
			case "reasoning_tokens":
				return &td.ReasoningTokens
			}
			return nil
		})
	})
	return ok && d.end()
}

// maxUsageDepth bounds the nesting decodeUsage reads.
const maxUsageDepth = 4

// usageDecoder reads a usage object with jsonScan's primitives.
type usageDecoder struct {
	jsonScan
}

// object reads an object, calling member with each member's name, the
// decoder at its value, which member reads.
func (d *usageDecoder) object(member func(name []byte) bool) bool {
	d.ws()
	if !d.byte('{') {
		return false
	}
	d.ws()
	if d.byte('}') {
		return true
	}
	for {
		name, ok := d.name()
		if !ok || !member(name) {
			return false
		}
		d.ws()
		switch {
		case d.byte(','):
		case d.byte('}'):
			return true
		default:
			return false
		}
	}
}

// counts reads an object of counts: field names the integer field of a
// name, or nil for one to skip. A repeated field reports false.
func (d *usageDecoder) counts(field func(name []byte) *int64) bool {
	var seen []*int64
	var seenBuf [4]*int64
	seen = seenBuf[:0]
	return d.object(func(name []byte) bool {
		dst := field(name)
		if dst == nil {
			return plainName(name) && d.skip(2)
		}
		for _, s := range seen {
			if s == dst {
				return false
			}
		}
		seen = append(seen, dst)
		var ok bool
		*dst, ok = d.uint()
		return ok
	})
}

// name reads a member name without escapes and the colon after it. A
// name that is no field's must also pass plainName, which every field's
// does: the caller checks it only for those.
func (d *usageDecoder) name() ([]byte, bool) {
	d.ws()
	name, ok := d.plainString()
	if !ok {
		return nil, false
	}
	d.ws()
	if !d.byte(':') {
		return nil, false
	}
	d.ws()
	return name, true
}

// plainName reports whether name is of [a-z0-9_] and not empty: a name
// that encoding/json's case-insensitive matching gives to a field only if
// it is that field's own.
func plainName(name []byte) bool {
	for _, c := range name {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return len(name) > 0
}

// skip reads a value of a member nobody reads: an unsigned integer, true,
// false, null, a string without escapes or control bytes, or an object of
// such values, at most maxUsageDepth deep.
func (d *usageDecoder) skip(depth int) bool {
	if d.i >= len(d.b) {
		return false
	}
	switch c := d.b[d.i]; {
	case '0' <= c && c <= '9':
		_, ok := d.uint()
		return ok
	case c == '"':
		_, _, ok := d.plainSpan()
		return ok
	case c == '{':
		if depth >= maxUsageDepth {
			return false
		}
		return d.object(func(name []byte) bool { return plainName(name) && d.skip(depth+1) })
	case c == 't':
		return d.literal("true")
	case c == 'f':
		return d.literal("false")
	case c == 'n':
		return d.null()
	}
	return false
}
