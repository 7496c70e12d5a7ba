package lease

import (
	"testing"
	"time"
)

// A pause of a key between bursts (over 8 rate windows, up to 64) keeps
// its measured rate, so that the chunks after it are sized as before it
// and the burst's first requests are not sent to the store while a
// window is measured; a longer idleness replaces it with what was
// measured across it.
func TestRateKeptAcrossPause(t *testing.T) {
	w := int64(25 * time.Millisecond)
	e := &entry{}
	now := int64(0)
	for range 10 { // 100 units a window: 4000/s
		for range 100 {
			e.observe(now, 1, w)
		}
		now += w
	}
	e.observe(now, 1, w)
	measured := e.rate
	if measured < 3000 || measured > 5000 {
		t.Fatalf("rate %v after steady use, want about 4000/s", measured)
	}
	now += 12 * w // 300ms: a pause
	e.observe(now, 1, w)
	if e.rate != measured {
		t.Fatalf("rate %v after a pause of %v, want %v kept", e.rate, time.Duration(12*w), measured)
	}
	now += 100 * w // 2.5s: idle, not a pause
	e.observe(now, 1, w)
	if e.rate >= measured/100 {
		t.Fatalf("rate %v after %v idle, want what was measured across it (under %v)", e.rate, time.Duration(100*w), measured/100)
	}
}
