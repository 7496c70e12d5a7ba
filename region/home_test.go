package region_test

import (
	"fmt"
	"testing"

	"github.com/sluice-io/sluice/region"
)

// Every instance computes the same home for a key, whatever order it
// lists the regions in, and keys spread over all regions.
func TestHashHome(t *testing.T) {
	a := region.HashHome([]string{"eu", "us", "ap"})
	b := region.HashHome([]string{"ap", "eu", "us"})
	count := map[string]int{}
	for i := range 3000 {
		k := fmt.Sprintf("sluice:{user:%d}:api:gcra", i)
		if a(k) != b(k) {
			t.Fatalf("key %d: home %s or %s by the order of the regions", i, a(k), b(k))
		}
		count[a(k)]++
	}
	for _, r := range []string{"eu", "us", "ap"} {
		if count[r] < 800 {
			t.Fatalf("homes %v: %s has under 800 of 3000 keys", count, r)
		}
	}
}
