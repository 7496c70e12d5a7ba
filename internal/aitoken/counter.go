package aitoken

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
)

// EncodingForModel returns the encoding of an OpenAI model, as tiktoken's
// model table maps it (tiktoken/model.py), or "" for a model it does not
// know, whose tokens only the heuristic can estimate. A provider prefix
// "openai/" and a fine-tune's "ft:" are ignored.
//
//	o200k_base: gpt-5*, gpt-4.1*, gpt-4.5*, gpt-4o*, chatgpt-4o*, o1*, o3*, o4*
//	cl100k_base: gpt-4* (the others), gpt-3.5-turbo*, gpt-35-turbo*,
//	             text-embedding-3-*, text-embedding-ada-002
func EncodingForModel(model string) Encoding {
	m := strings.TrimPrefix(strings.TrimPrefix(strings.ToLower(model), "openai/"), "ft:")
	for _, p := range []string{"gpt-5", "gpt-4.1", "gpt-4.5", "gpt-4o", "chatgpt-4o"} {
		if strings.HasPrefix(m, p) {
			return O200kBase
		}
	}
	for _, p := range []string{"o1", "o3", "o4"} {
		if m == p || strings.HasPrefix(m, p+"-") {
			return O200kBase
		}
	}
	for _, p := range []string{"gpt-4", "gpt-3.5-turbo", "gpt-35-turbo", "text-embedding-3-", "text-embedding-ada-002"} {
		if strings.HasPrefix(m, p) {
			return Cl100kBase
		}
	}
	return ""
}

// MaxExactBytes bounds the text one Counter.PromptTokens call tokenizes
// exactly (about 64k tokens of English); a string that does not fit what
// is left of it is estimated whole with the heuristic, which errs high on
// English, code, base64 and whitespace runs but may count as little as
// half of odd text (TestHeuristicBound, docs/gateway.md), and settlement
// corrects it. Exact counting
// costs 25-100 ns per byte of prose and code and up to about 1 µs per
// byte of text made to be slow, one long piece merged whole
// (docs/BENCHMARKS.md), so one request's count costs at most some 60-300
// ms of CPU however large its body.
const MaxExactBytes = 256 << 10

// Counter counts tokens for one model: exactly with its encoding's
// vocabulary when the model has one (Exact), with the package's heuristic
// otherwise. A Counter is immutable and safe for concurrent use; the
// zero Counter is the heuristic.
type Counter struct {
	enc Encoding
	v   *vocab
}

// Heuristic is the Counter of models without a known encoding.
var Heuristic = &Counter{}

// ForModel returns the Counter of model: exact for the OpenAI models that
// EncodingForModel knows, the heuristic for others (or if the vocabulary
// could not be loaded, which the tests rule out). The first call for an
// encoding loads its vocabulary (about 0.1 s); Preload does it ahead.
func ForModel(model string) *Counter {
	c, err := ForEncoding(EncodingForModel(model))
	if err != nil {
		return Heuristic
	}
	return c
}

// ForEncoding returns the Counter of enc; "" is the heuristic.
func ForEncoding(enc Encoding) (*Counter, error) {
	if enc == "" {
		return Heuristic, nil
	}
	load, ok := counters[enc]
	if !ok {
		return nil, fmt.Errorf("aitoken: unknown encoding %.40q; valid: cl100k_base, o200k_base", string(enc))
	}
	return load()
}

// Preload loads every embedded vocabulary now rather than at the first
// request that needs it.
func Preload() error {
	for _, enc := range []Encoding{Cl100kBase, O200kBase} {
		if _, err := ForEncoding(enc); err != nil {
			return err
		}
	}
	return nil
}

// Encoding returns the counter's encoding, "" for the heuristic.
func (c *Counter) Encoding() Encoding { return c.enc }

// Exact reports whether the counter tokenizes with a vocabulary.
func (c *Counter) Exact() bool { return c.v != nil }

// Count returns the tokens of text: exact, or the heuristic's estimate.
// Its cost is linear in len(text); Count does not apply MaxExactBytes.
func (c *Counter) Count(text string) int64 {
	if c.v == nil {
		return Count(text)
	}
	return c.v.count(text)
}

// Per-function overheads of tool definitions, from the OpenAI cookbook's
// num_tokens_for_tools ("How to count tokens with tiktoken", section 7),
// which matches the API's prompt_tokens for gpt-4o (101) and gpt-4 (105) on
// its example.
const (
	toolInitO200K = 7  // func_init for gpt-4o and later
	toolInitCL100 = 10 // func_init for gpt-4 and gpt-3.5-turbo
	toolPropInit  = 3  // prop_init: a function with properties
	toolPropKey   = 3  // prop_key: each property
	toolEnumInit  = -3 // enum_init: a property with an enum
	toolEnumItem  = 3  // enum_item: each enum value
	toolEnd       = 12 // func_end: once after the functions
	nameOverhead  = 1  // tokens_per_name
)

// PromptTokens returns the prompt tokens of r. With an exact Counter it
// follows OpenAI's own counting (the cookbook's num_tokens_from_messages
// and num_tokens_for_tools): 3 tokens per message, the tokens of each of
// its values (role and content included), 1 more for a name, 3 to prime
// the reply, and per tool definition the cookbook's overheads; images
// count ImageTokens; a prompt given as token ids counts one per id. Text
// beyond MaxExactBytes is estimated with the heuristic. The heuristic
// Counter returns r.PromptTokens().
func (c *Counter) PromptTokens(r *Request) int64 {
	return c.PromptTokensCached(r, nil)
}

// PromptTokensCached is PromptTokens, with the counts of large messages
// remembered in cache (nil: none), so that a conversation resent turn
// after turn is tokenized once per message. The count is the same with
// or without the cache.
func (c *Counter) PromptTokensCached(r *Request, cache *Cache) int64 {
	if c.v == nil {
		return r.PromptTokens()
	}
	w := &walker{c: c, budget: MaxExactBytes}
	var n int64
	for _, m := range r.Messages {
		n += MessageOverhead + w.cachedMessage(m, cache)
	}
	if len(r.Messages) > 0 {
		n += ReplyOverhead
	}
	n += w.input(r.Prompt) + w.input(r.Input) + w.text(r.Instructions)
	n += w.tools(r.Tools) + w.tools(r.Functions)
	return n
}

// walker counts the parts of one request against a budget of exact bytes.
type walker struct {
	c      *Counter
	budget int
	short  bool // a text did not fit the budget and was estimated
}

func (w *walker) text(s string) int64 {
	if len(s) <= w.budget {
		w.budget -= len(s)
		return w.c.v.count(s)
	}
	w.budget, w.short = 0, true
	return Count(s)
}

// cachedMessage is message(raw), from cache when it counted raw before
// with the budget to count it all exactly, and the budget left now covers
// as much: the walk would then tokenize the same texts exactly again (the
// order of a message's members does not matter while every text fits).
func (w *walker) cachedMessage(raw json.RawMessage, cache *Cache) int64 {
	if cache == nil || len(raw) < minCachedBytes {
		return w.message(raw)
	}
	k := cacheKey{enc: w.c.enc, sum: sha256.Sum256(raw)}
	if v, ok := cache.get(k); ok && v.consumed <= w.budget {
		w.budget -= v.consumed
		cache.hits.Add(1)
		return v.tokens
	}
	before := w.budget
	w.short = false
	n := w.message(raw)
	if !w.short {
		cache.put(k, cacheVal{tokens: n, consumed: before - w.budget})
	}
	return n
}

// message counts one chat message or responses input item: every value,
// as the cookbook does (role included), plus nameOverhead for a name.
func (w *walker) message(raw json.RawMessage) int64 {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return w.text(string(raw))
	}
	m, ok := v.(map[string]any)
	if !ok {
		return w.value(v, 1)
	}
	var n int64
	for k, e := range m {
		switch k {
		case "name":
			n += nameOverhead
		case "id", "type", "tool_call_id", "status":
			continue // ids and markers, not text the model reads as such
		}
		n += w.value(e, 1)
	}
	return n
}

// input counts a JSON value of text: strings, arrays, content parts,
// message items.
func (w *walker) input(raw json.RawMessage) int64 {
	if len(raw) == 0 {
		return 0
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return w.text(string(raw))
	}
	return w.value(v, 0)
}

// maxDepth bounds the recursion on a nested value; deeper parts are
// counted as text.
const maxDepth = 32

func (w *walker) value(v any, depth int) int64 {
	switch v := v.(type) {
	case string:
		return w.text(v)
	case float64:
		return 1 // a token id
	case []any:
		var n int64
		for _, e := range v {
			n += w.value(e, depth+1)
		}
		return n
	case map[string]any:
		if depth > maxDepth {
			b, _ := json.Marshal(v)
			return Count(string(b))
		}
		var n int64
		if _, ok := v["role"]; ok && depth == 1 {
			n += MessageOverhead // a responses input item is a message
		}
		for k, e := range v {
			switch k {
			case "type", "id", "tool_call_id", "detail", "status":
				continue
			case "image_url", "input_image", "image", "image_file":
				n += ImageTokens
				continue
			case "name":
				n += nameOverhead
			}
			n += w.value(e, depth+1)
		}
		return n
	}
	return 0
}

// tools counts tool or function definitions as the cookbook's
// num_tokens_for_tools does: per function its name and description, per
// parameter its name, type, description and enum values, with the
// overheads above. What the formula does not cover (nested schemas,
// tools other than functions) counts as its JSON text.
func (w *walker) tools(raw json.RawMessage) int64 {
	if len(raw) == 0 || string(raw) == "null" {
		return 0
	}
	var list []map[string]json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return w.text(string(raw))
	}
	if len(list) == 0 {
		return 0
	}
	funcInit := int64(toolInitCL100)
	if w.c.enc == O200kBase {
		funcInit = toolInitO200K
	}
	var n int64
	for _, t := range list {
		fn := t
		if f, ok := t["function"]; ok {
			fn = nil
			_ = json.Unmarshal(f, &fn)
		} else if typ := str(t["type"]); typ != "" && typ != "function" {
			b, _ := json.Marshal(t)
			n += w.text(string(b)) // a built-in tool
			continue
		}
		n += funcInit + w.function(fn)
	}
	return n + toolEnd
}

// function counts one function definition.
func (w *walker) function(fn map[string]json.RawMessage) int64 {
	n := w.text(str(fn["name"]) + ":" + strings.TrimSuffix(str(fn["description"]), "."))
	var params struct {
		Properties map[string]map[string]json.RawMessage `json:"properties"`
	}
	if json.Unmarshal(fn["parameters"], &params) != nil || len(params.Properties) == 0 {
		if p := fn["parameters"]; len(p) > 0 && params.Properties == nil && string(p) != "null" {
			var probe map[string]json.RawMessage
			if json.Unmarshal(p, &probe) != nil {
				n += w.text(string(p))
			}
		}
		return n
	}
	n += toolPropInit
	for name, prop := range params.Properties {
		n += toolPropKey
		if enum := prop["enum"]; len(enum) > 0 {
			var items []any
			if json.Unmarshal(enum, &items) == nil {
				n += toolEnumInit
				for _, it := range items {
					n += toolEnumItem
					if s, ok := it.(string); ok {
						n += w.text(s)
					} else {
						b, _ := json.Marshal(it)
						n += w.text(string(b))
					}
				}
			}
		}
		typ := str(prop["type"])
		if typ == "" && len(prop["type"]) > 0 {
			typ = string(prop["type"]) // a list of types
		}
		n += w.text(name + ":" + typ + ":" + strings.TrimSuffix(str(prop["description"]), "."))
		for k, v := range prop {
			switch k {
			case "type", "description", "enum":
			default:
				n += w.text(k + ":" + string(v)) // nested schema: as text
			}
		}
	}
	return n
}

// str decodes a JSON string, or returns "".
func str(raw json.RawMessage) string {
	var s string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		return s
	}
	return ""
}
