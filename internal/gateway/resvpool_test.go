package gateway

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestResvPoolOrder holds the pool's array with room in front (popFront,
// push, insert) to a plain slice with slices.Insert, the form it
// replaced, over random takes, batches and reservations given back; and
// the slots it no longer uses hold no reservation (their ids would be
// kept from the GC).
func TestResvPoolOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var p resvPool
	var want []pooledResv
	t0 := time.Unix(1_700_000_000, 0)
	n := 0
	next := func() pooledResv {
		n++
		return pooledResv{id: strconv.Itoa(n), key: "k" + strconv.Itoa(n), at: t0.Add(time.Duration(n) * time.Millisecond)}
	}
	for step := range 20000 {
		switch op := rng.IntN(10); {
		case op < 4 && len(want) > 0: // a request takes the oldest
			got := p.popFront()
			if got != want[0] {
				t.Fatalf("step %d: took %v, want %v", step, got, want[0])
			}
			want = want[1:]
		case op < 5: // a batch arrives
			for range rng.IntN(70) {
				r := next()
				p.push(r)
				want = append(want, r)
			}
		default: // a reservation comes back, by its age
			r := pooledResv{id: "back" + strconv.Itoa(step), at: t0.Add(time.Duration(rng.IntN(n+1)) * time.Millisecond)}
			i, _ := slices.BinarySearchFunc(p.ids, r.at, func(e pooledResv, t time.Time) int { return e.at.Compare(t) })
			p.insert(i, r)
			want = slices.Insert(want, i, r)
		}
		if !slices.Equal(p.ids, want) {
			t.Fatalf("step %d: pool %v, want %v", step, p.ids, want)
		}
		for j := range p.buf {
			if (j < p.head || j >= p.head+len(p.ids)) && p.buf[j] != (pooledResv{}) {
				t.Fatalf("step %d: slot %d outside the pool holds %v", step, j, p.buf[j])
			}
		}
		if len(want) > 300 {
			for range 200 {
				p.popFront()
			}
			want = want[200:]
		}
	}
}
