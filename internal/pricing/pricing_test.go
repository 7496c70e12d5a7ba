package pricing

import (
	"errors"
	"math"
	"testing"
)

func TestParseUSD(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Micros
	}{
		{"0", 0}, {"1", Dollar}, {"2.50", 2_500_000}, {"$0.15", 150_000}, {"0.000001", 1},
		{".5", 500_000}, {"3.", 3 * Dollar}, {"1_000", 1000 * Dollar}, {" 7.25 ", 7_250_000},
		{"1099511.627776", MaxMicros},
	} {
		got, err := ParseUSD(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseUSD(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	// Hostile or mistaken amounts are refused, never rounded or wrapped.
	for _, in := range []string{"", ".", "-1", "1e3", "0.0000001", "1.2.3", "NaN", "Inf", "0x10", "1099511.627777",
		"99999999999999999999", "１", "+1", "1,5"} {
		if got, err := ParseUSD(in); !errors.Is(err, ErrInvalidAmount) {
			t.Errorf("ParseUSD(%q) = %d, %v; want ErrInvalidAmount", in, got, err)
		}
	}
}

func TestMicrosString(t *testing.T) {
	for _, c := range []struct {
		m    Micros
		want string
	}{{0, "0.000000"}, {1, "0.000001"}, {2_500_000, "2.500000"}, {-150, "-0.000150"}, {math.MinInt64, "-9223372036854.775808"}} {
		if got := c.m.String(); got != c.want {
			t.Errorf("%d: %q, want %q", int64(c.m), got, c.want)
		}
	}
	var m Micros
	if err := m.UnmarshalText([]byte("12.345678")); err != nil || m != 12_345_678 {
		t.Fatal(m, err)
	}
	if b, _ := m.MarshalText(); string(b) != "12.345678" {
		t.Fatal(string(b))
	}
}

func TestCost(t *testing.T) {
	gpt4o := defaultPrices["gpt-4o"]
	// 1000 input at $2.50/M = $0.0025; 1000 cached at $1.25/M = $0.00125;
	// 500 output at $10/M = $0.005; 100 reasoning at $10/M = $0.001.
	if got := gpt4o.Cost(Usage{1000, 1000, 500, 100}); got != 2500+1250+5000+1000 {
		t.Fatalf("cost %d", got)
	}
	// Rounded up to the micro-dollar, once for the whole request.
	mini := defaultPrices["gpt-4o-mini"]
	if got := mini.Cost(Usage{Input: 1}); got != 1 {
		t.Fatalf("one token: %d", got)
	}
	if got := mini.Cost(Usage{Input: 20}); got != 3 { // 20 × 0.15 = 3.0
		t.Fatalf("20 tokens: %d", got)
	}
	if got := mini.Cost(Usage{}); got != 0 {
		t.Fatalf("nothing: %d", got)
	}
	// Hostile counts: negative is 0, huge saturates instead of wrapping.
	if got := gpt4o.Cost(Usage{-5, -5, -5, -5}); got != 0 {
		t.Fatalf("negative: %d", got)
	}
	if got := gpt4o.Cost(Usage{math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64}); got != math.MaxInt64 {
		t.Fatalf("huge: %d", got)
	}
	top := Price{MaxPrice, MaxPrice, MaxPrice, MaxPrice}
	if got := top.Cost(Usage{Output: 1 << 40}); got != (1<<40)*100_000 {
		t.Fatalf("2^40 at the top price: %d", got)
	}
	if got := top.Cost(Usage{Output: 1 << 62}); got != math.MaxInt64 {
		t.Fatalf("2^62 at the top price: %d", got)
	}
	if got := top.Cost(Usage{Output: 1000}); got != 100_000*1000 {
		t.Fatalf("1000 at $100k/M: %d", got)
	}
}

// FuzzCost holds Cost to its contract: never negative, monotone in every
// count, and equal to the exact rational result rounded up when small.
func FuzzCost(f *testing.F) {
	f.Add(int64(1000), int64(10), int64(500), int64(0), int64(2_500_000), int64(3))
	f.Add(int64(math.MaxInt64), int64(-1), int64(1), int64(1<<40), int64(1), int64(0))
	f.Fuzz(func(t *testing.T, a, b, c, d, price, kind int64) {
		p := Price{Micros(price), Micros(price / 2), Micros(price * 4), Micros(price)}
		u := Usage{a, b, c, d}
		got := p.Cost(u)
		if got < 0 {
			t.Fatalf("negative cost %d", got)
		}
		k := Kind(uint64(kind) % NumKinds)
		more := u
		if more[k] < math.MaxInt64 {
			more[k] = max(more[k], 0) + 1
		}
		if p.Cost(more) < got {
			t.Fatalf("not monotone: %v → %d, %v → %d", u, got, more, p.Cost(more))
		}
	})
}

func TestOpenAIUsage(t *testing.T) {
	if u := OpenAIUsage(100, 30, 50, 20); u != (Usage{70, 30, 30, 20}) {
		t.Fatal(u)
	}
	// A part larger than its whole, or negative, is capped.
	if u := OpenAIUsage(10, 99, -3, 7); u != (Usage{0, 10, 0, 0}) {
		t.Fatal(u)
	}
	if got := (Usage{math.MaxInt64, 1, 0, 0}).Total(); got != math.MaxInt64 {
		t.Fatal(got)
	}
}

func TestLookup(t *testing.T) {
	tb := Defaults()
	for model, want := range map[string]string{
		"gpt-4o": "gpt-4o", "gpt-4o-2024-08-06": "gpt-4o", "gpt-4o-mini-2024-07-18": "gpt-4o-mini",
		"claude-sonnet-4-5-20250929": "claude-sonnet-4-5",
	} {
		p, ok := tb.Lookup(model)
		if !ok || p != defaultPrices[want] {
			t.Errorf("%s: %v %v, want %s's", model, p, ok, want)
		}
	}
	// Only a date is stripped: another variant is another model.
	for _, model := range []string{"gpt-4o-audio-preview", "gpt-4o-2024", "gpt-4o-20x4-08-06", "unknown", ""} {
		if p, ok := tb.Lookup(model); ok {
			t.Errorf("%s priced %v", model, p)
		}
	}
	tb.Set("local", Price{Input: 1})
	tb.SetFallback(Price{Input: 7})
	if p, _ := tb.Lookup("local"); p[Input] != 1 {
		t.Fatal(p)
	}
	if p, ok := tb.Lookup("unknown"); !ok || p[Input] != 7 {
		t.Fatal(p, ok)
	}
	for m, p := range defaultPrices {
		if err := p.Validate(); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
	if err := (Price{Output: MaxPrice + 1}).Validate(); !errors.Is(err, ErrInvalidAmount) {
		t.Fatal(err)
	}
}

func TestKinds(t *testing.T) {
	for _, k := range Kinds() {
		if got, err := ParseKind(k.String()); err != nil || got != k {
			t.Fatal(k, got, err)
		}
	}
	if _, err := ParseKind("bogus"); err == nil {
		t.Fatal("bogus kind read")
	}
}
