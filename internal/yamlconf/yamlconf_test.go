package yamlconf

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var errTest = errors.New("test: invalid")

type doc struct {
	Name   string            `yaml:"name"`
	Wait   time.Duration     `yaml:"wait"`
	Models map[string]limits `yaml:"models"`
	Items  []limits          `yaml:"items"`
	Inline `yaml:",inline"`
}

type limits struct {
	RPM int64 `yaml:"rpm"`
}

// Inline is inlined into doc.
type Inline struct {
	Extra string `yaml:"extra"`
}

func TestDecodeLocatesEveryProblem(t *testing.T) {
	data := "name: a\nwait: soon\nextra: x\nmodels:\n  gpt-3.5-turbo:\n    rpmm: 3\n  big:\n    rpm: lots\nitems:\n  - rpm: 1\n  - {rpm: 2, tpm: 3}\n"
	var d doc
	dc, err := Decode(errTest, "f.yaml", []byte(data), &d)
	if err != nil {
		t.Fatal(err)
	}
	dc.Addf("models.gpt-3.5-turbo", "no limits")    // consequence of the typo: dropped
	dc.Addf("models.big.rpm", "must be positive")   // consequence of the type error: dropped
	dc.Addf("items[1].rpm", "too big")              // independent: kept
	dc.Sub("models").Addf("gpt-3.5-turbo.x", "sub") // under a prefix, dotted key
	err = dc.Err()
	if !errors.Is(err, errTest) {
		t.Fatalf("%v does not wrap the kind", err)
	}
	want := []string{
		"f.yaml:2: wait: cannot use `soon` as time.Duration",
		"f.yaml:5: models.gpt-3.5-turbo.x: sub",
		"f.yaml:6: models.gpt-3.5-turbo.rpmm: unknown field; did you mean rpm? valid: rpm",
		"f.yaml:8: models.big.rpm: cannot use `lots` as int64",
		"f.yaml:11: items[1].tpm: unknown field; did you mean rpm? valid: rpm",
		"f.yaml:11: items[1].rpm: too big",
	}
	var ye *Error
	errors.As(err, &ye)
	var got []string
	for _, p := range ye.Problems {
		got = append(got, p.String())
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if d.Extra != "x" || d.Models["big"].RPM != 0 || d.Items[1].RPM != 2 {
		t.Errorf("decoded %+v", d)
	}
}

func TestSyntaxErrorLine(t *testing.T) {
	for _, c := range []struct {
		data string
		line string
	}{
		{"a:\n  b: 1\n  c: 2\n d: 3\n", "f.yaml:4: "},
		{"a: 1\nb:\n\t- x\n", "f.yaml:3: "},
		{"a: 1\nb: c: d\n", "f.yaml:2: "},
		{"", "f.yaml: empty file"},
		{"- a\n- b\n", "f.yaml:1: the top level must be a mapping"},
	} {
		_, err := Decode(errTest, "f.yaml", []byte(c.data), &doc{})
		if err == nil || !errors.Is(err, errTest) || !strings.Contains(err.Error(), c.line) || strings.Contains(err.Error(), " yaml: ") {
			t.Errorf("%q: %v, want %q", c.data, err, c.line)
		}
	}
}

func TestNewHasNoLines(t *testing.T) {
	d := New(errTest, "")
	if d.Err() != nil {
		t.Fatal("error without problems")
	}
	d.Sub("gateway").Addf("tiers.free", "bad")
	if got := d.Err().Error(); got != "test: invalid:\n  gateway.tiers.free: bad" {
		t.Errorf("got %q", got)
	}
}

func TestClosest(t *testing.T) {
	names := []string{"rpm", "rpm_burst", "tpm", "burst", "policies", "client"}
	for in, want := range map[string]string{"rpmm": "rpm", "brust": "burst", "polices": "policies", "clinet": "client", "tokens_per_minute": "", "RPM": "rpm", "zzz": ""} {
		if got := closest(in, names); got != want {
			t.Errorf("closest(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte("name: a\nmodels: {x: {rpm: 1}}\nitems: [{rpm: 2}]\n"))
	f.Add([]byte("a:\n  b: 1\n c: 2\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(errTest, "f.yaml", b, &doc{})
		if err != nil {
			if !errors.Is(err, errTest) {
				t.Fatalf("error does not wrap the kind: %v", err)
			}
			return
		}
		d.Addf("models.x.rpm", "x")
		if err := d.Err(); err != nil && !errors.Is(err, errTest) {
			t.Fatal(err)
		}
	})
}

// TestDocDecodeChecksTypesNotFields: a format that checks its own keys
// decodes into any first (no field is unknown), then into its structs,
// whose type errors are located and make later problems at the same field
// consequences.
func TestDocDecodeChecksTypesNotFields(t *testing.T) {
	data := "name: a\nitems:\n  - rpm: -x\n    other: 1\n"
	var generic any
	dc, err := Decode(errTest, "f.yaml", []byte(data), &generic)
	if err != nil || dc.Len() != 0 {
		t.Fatalf("decode into any: %v, %d problems", err, dc.Len())
	}
	var d doc
	if dc.Decode(&d) {
		t.Fatal("decoded a string into an int64")
	}
	dc.Addf("items[0].rpm", "must be positive") // consequence: dropped
	dc.Addf("name", "too short")                // independent: kept
	want := "test: invalid:\n  f.yaml:1: name: too short\n  f.yaml:3: items[0].rpm: cannot use `-x` as int64"
	if err := dc.Err(); err == nil || err.Error() != want {
		t.Fatalf("error\n%v\nwant\n%s", err, want)
	}
	if New(errTest, "").Decode(&d) {
		t.Error("a Doc built in code decoded")
	}
}
