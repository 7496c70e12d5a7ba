package region_test

import "github.com/sluice-io/sluice/internal/regiontest"

// wan is the link between two regions (internal/regiontest.WAN, shared
// with the doors' tests): a one-way latency each way, and Partition/Heal.
type wan = regiontest.WAN
