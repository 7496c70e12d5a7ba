// Package yamlconf decodes YAML configuration files strictly and reports
// every problem of a file in one pass, each located as
// "file:line: path: message": unknown fields (with the valid names and the
// closest one), values of the wrong type, and whatever the caller's own
// validation finds. The service config (internal/config) and the gateway
// config (internal/gateway) both load through it, so that a gateway section
// inside a service file and a gateway file on its own read the same.
//
// A load takes three steps, as Prometheus's does: Decode (syntax, unknown
// fields, types), then the caller applies defaults and validates, calling
// Doc.Addf for each problem, then Doc.Err returns them all at once. A
// validation problem at a field whose decoding already failed (or at one of
// its parents) is dropped: it is a consequence, not a second mistake.
package yamlconf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// MaxFileBytes bounds a configuration file.
const MaxFileBytes = 16 << 20

// Problem is one error, located in its file.
type Problem struct {
	// File is the file's name as given.
	File string
	// Line is the 1-based line, or 0 when unknown (a document built in
	// code rather than read from a file).
	Line int
	// Path names the field, such as "tiers.free.rpm" or "keys[2].tier";
	// empty for the document as a whole.
	Path string
	// Msg says what is wrong and, where there are any, the valid values.
	Msg string
}

// String formats the problem as "file:line: path: message", leaving out the
// parts that are unknown.
func (p Problem) String() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File)
		if p.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(p.Line))
		}
		b.WriteString(": ")
	}
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Error holds every problem found in one file. It wraps Kind, the
// sentinel of the package that loaded the file, so that errors.Is works.
type Error struct {
	// Kind is the loading package's sentinel, such as config.ErrInvalid.
	Kind error
	// Problems are in the order of their lines in the file.
	Problems []Problem
}

// Error formats the problems one per line under the sentinel's text.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Kind != nil {
		b.WriteString(e.Kind.Error())
		b.WriteByte(':')
	}
	for i, p := range e.Problems {
		if e.Kind != nil || i > 0 {
			b.WriteString("\n  ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Unwrap returns Kind.
func (e *Error) Unwrap() error { return e.Kind }

// ReadFile reads the file at path, refusing one larger than MaxFileBytes.
// Errors are wrapped with kind (too large) or name the path (I/O).
func ReadFile(kind error, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err // *PathError names the path
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, MaxFileBytes+1)); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if buf.Len() > MaxFileBytes {
		return nil, &Error{Kind: kind, Problems: []Problem{{File: path, Msg: fmt.Sprintf("larger than %d bytes", MaxFileBytes)}}}
	}
	return buf.Bytes(), nil
}

// Doc is a document being checked: it locates paths in the file and
// collects problems. A Doc made by Sub shares its parent's problems and
// prefixes the paths it is given.
type Doc struct {
	s      *state
	prefix string
}

type state struct {
	kind     error
	file     string
	root     *yaml.Node // the document's top node; nil for a Doc built in code
	problems []Problem
	decoded  int // problems[:decoded] came from decoding
}

// New returns a Doc for a document built in code rather than read from a
// file: its problems have no line. file may be empty.
func New(kind error, file string) *Doc {
	return &Doc{s: &state{kind: kind, file: file}}
}

// Decode parses data, rejects mapping keys that out's type has no field
// for, and decodes into out (a pointer to a struct, or to an any for a
// format whose keys the caller checks itself), recording unknown fields and
// wrongly typed values in the returned Doc. The error is non-nil,
// an *Error wrapping kind, only when data is not YAML at all or is empty:
// then there is nothing further to check.
func Decode(kind error, file string, data []byte, out any) (*Doc, error) {
	d := New(kind, file)
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		ps := syntaxProblems(file, err)
		if len(ps) == 1 {
			ps[0].Line = syntaxLine(data, ps[0].Line)
		}
		d.s.problems = append(d.s.problems, ps...)
		return nil, d.Err()
	}
	if len(root.Content) == 0 {
		d.s.problems = append(d.s.problems, Problem{File: file, Msg: "empty file"})
		return nil, d.Err()
	}
	d.s.root = root.Content[0]
	if d.s.root.Kind != yaml.MappingNode {
		d.s.problems = append(d.s.problems, Problem{File: file, Line: d.s.root.Line, Msg: "the top level must be a mapping of field: value"})
		return nil, d.Err()
	}
	d.checkFields(d.s.root, reflect.TypeOf(out), "")
	if err := d.s.root.Decode(out); err != nil {
		d.typeProblems(err)
	}
	d.s.decoded = len(d.s.problems)
	return d, nil
}

// Decode decodes the document once more, into out, without checking its
// fields, recording the values of the wrong type as Decode does. It is for
// a format whose keys the caller checks itself, before decoding into its
// structs: the envoyproxy/ratelimit format accepts a key by name at any
// level. It reports whether out was decoded without a problem; it is false
// for a Doc built in code.
func (d *Doc) Decode(out any) bool {
	if d.s.root == nil {
		return false
	}
	before := len(d.s.problems)
	if err := d.s.root.Decode(out); err != nil {
		d.typeProblems(err)
	}
	if d.s.decoded == before {
		d.s.decoded = len(d.s.problems)
	}
	return len(d.s.problems) == before
}

// Sub returns a Doc whose paths are relative to path, for a section
// checked by its own package: Sub("gateway").Addf("tiers.free", ...)
// records "gateway.tiers.free".
func (d *Doc) Sub(path string) *Doc {
	return &Doc{s: d.s, prefix: d.join(path)}
}

func (d *Doc) join(path string) string {
	switch {
	case d.prefix == "":
		return path
	case path == "":
		return d.prefix
	case strings.HasPrefix(path, "["):
		return d.prefix + path
	}
	return d.prefix + "." + path
}

// Addf records a problem at the field named by path, such as
// "policies.free.limit" or "keys[2].tier", relative to the Doc's prefix.
// It is dropped when decoding already reported a problem at that field or
// inside it.
func (d *Doc) Addf(path, format string, args ...any) {
	path = d.join(path)
	for _, p := range d.s.problems[:d.s.decoded] {
		if within(p.Path, path) {
			return
		}
	}
	d.s.problems = append(d.s.problems, Problem{File: d.s.file, Line: d.Line(path), Path: path, Msg: fmt.Sprintf(format, args...)})
}

// within reports whether path is parent or the field of one of its
// descendants.
func within(path, parent string) bool {
	if !strings.HasPrefix(path, parent) {
		return false
	}
	rest := path[len(parent):]
	return rest == "" || parent == "" || rest[0] == '.' || rest[0] == '['
}

// Len is the number of problems so far.
func (d *Doc) Len() int { return len(d.s.problems) }

// Problems returns the problems so far.
func (d *Doc) Problems() []Problem { return d.s.problems }

// Err returns an *Error holding every problem, or nil if there is none.
func (d *Doc) Err() error {
	if len(d.s.problems) == 0 {
		return nil
	}
	ps := slices.Clone(d.s.problems)
	slices.SortStableFunc(ps, func(a, b Problem) int { return a.Line - b.Line })
	return &Error{Kind: d.s.kind, Problems: ps}
}

// Line returns the line of the field at path (absolute, not relative to
// the prefix), or of its nearest parent present in the file; 0 for a Doc
// built in code. A field's line is its key's.
func (d *Doc) Line(path string) int {
	n := d.s.root
	if n == nil {
		return 0
	}
	line := n.Line
	parts := splitPath(path)
	for len(parts) > 0 {
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		key, val, used := child(n, parts)
		if val == nil {
			break
		}
		line = key.Line
		n, parts = val, parts[used:]
	}
	return line
}

// splitPath splits "a.b[2].c" into "a", "b", "[2]", "c".
func splitPath(path string) []string {
	var parts []string
	for _, p := range strings.Split(path, ".") {
		for {
			i := strings.IndexByte(p, '[')
			j := strings.IndexByte(p, ']')
			if i < 0 || j < i {
				break
			}
			if i > 0 {
				parts = append(parts, p[:i])
			}
			parts = append(parts, p[i:j+1])
			p = p[j+1:]
		}
		if p != "" {
			parts = append(parts, p)
		}
	}
	return parts
}

// child finds the node that the first parts of a path name under n. A
// mapping key may itself hold dots ("gpt-3.5-turbo"), so the longest run of
// parts that names a key wins. It returns the key node (the item itself
// for a sequence), the value and the number of parts used.
func child(n *yaml.Node, parts []string) (key, val *yaml.Node, used int) {
	switch n.Kind {
	case yaml.MappingNode:
		for k := len(parts); k >= 1; k-- {
			name := strings.Join(parts[:k], ".")
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == name {
					return n.Content[i], n.Content[i+1], k
				}
			}
		}
	case yaml.SequenceNode:
		if strings.HasPrefix(parts[0], "[") {
			i, err := strconv.Atoi(strings.Trim(parts[0], "[]"))
			if err == nil && i >= 0 && i < len(n.Content) {
				return n.Content[i], n.Content[i], 1
			}
		}
	}
	return nil, nil, 0
}

// Valid lists the names a reference may take, for an error message:
// "valid: a, b", or, when section defines none (it is missing, empty or
// misspelled), "none: the config defines no <section>", rather than a
// "valid:" that lists nothing.
func Valid(section string, names []string) string {
	if len(names) == 0 {
		return "none: the config defines no " + section
	}
	return "valid: " + strings.Join(names, ", ")
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// checkFields records the mapping keys that t has no field for, naming
// the valid ones and the closest. It walks maps, slices, nested and
// inlined structs, but not into aliases: an anchor's value is checked where
// it is written, and following aliases would let a small file with nested
// references cost quadratic time.
func (d *Doc) checkFields(n *yaml.Node, t reflect.Type, path string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		if t == reflect.TypeFor[time.Time]() || n.Kind != yaml.MappingNode {
			return
		}
		fields := map[string]reflect.Type{}
		var names []string
		structFields(t, fields, &names)
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			p := joinKey(path, key)
			ft, ok := fields[key]
			if !ok {
				msg := "unknown field; "
				if s := closest(key, names); s != "" {
					msg += "did you mean " + s + "? "
				}
				d.s.problems = append(d.s.problems, Problem{File: d.s.file, Line: n.Content[i].Line, Path: p, Msg: msg + "valid: " + strings.Join(names, ", ")})
				continue
			}
			if seen[key] {
				d.s.problems = append(d.s.problems, Problem{File: d.s.file, Line: n.Content[i].Line, Path: p, Msg: "given twice"})
			}
			seen[key] = true
			d.checkFields(n.Content[i+1], ft, p)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			d.checkFields(n.Content[i+1], t.Elem(), joinKey(path, n.Content[i].Value))
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i, c := range n.Content {
			d.checkFields(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	}
}

// structFields lists the YAML names of t's fields, in order, including
// those of inlined structs.
func structFields(t reflect.Type, fields map[string]reflect.Type, names *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				structFields(ft, fields, names)
			}
			continue
		}
		if tag == "" {
			tag = strings.ToLower(f.Name) // yaml.v3's default
		}
		fields[tag] = f.Type
		*names = append(*names, tag)
	}
}

// typeProblems turns yaml.v3's decoding errors ("line 4: cannot unmarshal
// !!str `lots` into int64") into located problems.
func (d *Doc) typeProblems(err error) {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		d.s.problems = append(d.s.problems, syntaxProblems(d.s.file, err)...)
		return
	}
	for _, e := range te.Errors {
		num, msg, _ := strings.Cut(strings.TrimPrefix(e, "line "), ": ")
		line, _ := strconv.Atoi(num)
		msg = strings.Replace(msg, "cannot unmarshal !!str", "cannot use", 1)
		msg = strings.Replace(msg, "cannot unmarshal !!", "cannot use a YAML ", 1)
		msg = strings.Replace(msg, "cannot unmarshal", "cannot use", 1)
		msg = strings.Replace(msg, "` into ", "` as ", 1)
		msg = strings.Replace(msg, " into ", " as ", 1)
		d.s.problems = append(d.s.problems, Problem{File: d.s.file, Line: line, Path: pathAtLine(d.s.root, "", line), Msg: msg})
	}
}

// pathAtLine returns the path of the first value at line.
func pathAtLine(n *yaml.Node, path string, line int) string {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := joinKey(path, n.Content[i].Value)
			val := n.Content[i+1]
			if val.Line == line && (val.Kind == yaml.ScalarNode || val.Kind == yaml.AliasNode) {
				return p
			}
			if found := pathAtLine(val, p, line); found != "" {
				return found
			}
			if n.Content[i].Line == line {
				return p // a flow or block collection that starts here
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if c.Line == line && c.Kind == yaml.ScalarNode {
				return p
			}
			if found := pathAtLine(c, p, line); found != "" {
				return found
			}
		}
	}
	return ""
}

// syntaxProblems turns yaml.v3's parse errors ("yaml: line 4: mapping
// values are not allowed in this context") into located problems.
func syntaxProblems(file string, err error) []Problem {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		out := make([]Problem, len(te.Errors))
		for i, e := range te.Errors {
			out[i] = lineProblem(file, e)
		}
		return out
	}
	return []Problem{lineProblem(file, strings.TrimPrefix(err.Error(), "yaml: "))}
}

// syntaxLine finds the line a syntax error is on. yaml.v3 often reports
// the start of the enclosing block instead ("line 1: did not find expected
// key" for a misindented line 4), so this looks for the first line, at or
// after that one, whose document prefix stops parsing, by bisection.
func syntaxLine(data []byte, reported int) int {
	var ends []int // ends[i] is the offset just past line i+1
	for i, c := range data {
		if c == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		ends = append(ends, len(data))
	}
	fails := func(lines int) bool {
		var n yaml.Node
		return yaml.Unmarshal(data[:ends[lines-1]], &n) != nil
	}
	lo, hi := max(reported, 1), len(ends) // the prefix of hi lines fails
	if lo > hi || !fails(hi) {
		return reported
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if fails(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

func lineProblem(file, msg string) Problem {
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		num, m, _ := strings.Cut(rest, ": ")
		if line, err := strconv.Atoi(num); err == nil {
			return Problem{File: file, Line: line, Msg: m}
		}
	}
	return Problem{File: file, Msg: msg}
}

// closest returns the name nearest to s by edit distance (a transposition
// counts as one edit), or "" when none is near enough to be a typo.
func closest(s string, names []string) string {
	best, bestD := "", max(1, len(s)/3)+1
	for _, n := range names {
		if d := distance(strings.ToLower(s), n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// distance is the optimal string alignment distance between a and b,
// bounded to short inputs (field names).
func distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30
	}
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
