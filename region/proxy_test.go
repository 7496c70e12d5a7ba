package region_test

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/regiontest"
)

// wan is the link between two regions (internal/regiontest.WAN, shared
// with the doors' tests): a one-way latency each way, and Partition/Heal.
type wan = regiontest.WAN

// newWAN links to target with oneWay latency each way until the test ends.
func newWAN(t testing.TB, target string, oneWay time.Duration) *wan {
	return regiontest.NewWAN(t, target, oneWay)
}
