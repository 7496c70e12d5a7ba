package server

import (
	"fmt"
	"testing"

	"github.com/sluice-io/sluice/internal/redistest"
)

// TestClusterHashTagHoldsAnyIdentity: a caller's policies share its
// identity's hash tag, whatever bytes the identity holds. Written into the
// tag as it was, an identity starting with '}' made the tag empty, Redis
// hashed each whole key, and two of the caller's policies charged in one
// call landed in different slots of the Cluster (a cross-slot error, 400
// naming the internal store keys); identities that escape to
// look alike keep their own counts.
func TestClusterHashTagHoldsAnyIdentity(t *testing.T) {
	c := redistest.SharedCluster(t)
	s := startService(t, svcOptions{redis: true, config: redisConfig(c.URL(), "error")})
	id := redistest.Prefix(t)
	for _, k := range []string{"}" + id, "}", id + "}x", "{" + id, "{}" + id, "}{" + id, "%" + id, "%7D" + id, id} {
		a := s.check(t, fmt.Sprintf(`{"checks":[{"policy":"a","key":%q},{"policy":"b","key":%q}]}`, k, k))
		if a.status != 200 || len(a.body["results"].([]any)) != 2 {
			t.Fatalf("identity %q, two policies in one call: %d %s", k, a.status, a.raw)
		}
	}
	// "}id" and "%7Did" are distinct callers: spending one leaves the other.
	for i := range 3 {
		a := s.check(t, fmt.Sprintf(`{"policy":"anon","key":%q}`, "}"+id+"a"))
		if want := []int{200, 200, 429}[i]; a.status != want {
			t.Fatalf("request %d of }id: %d %s, want %d", i, a.status, a.raw, want)
		}
	}
	if a := s.check(t, fmt.Sprintf(`{"policy":"anon","key":%q}`, "%7D"+id+"a")); a.status != 200 || a.num("remaining") != 1 {
		t.Fatalf("%%7Did after }id was spent: %d %s", a.status, a.raw)
	}
}
