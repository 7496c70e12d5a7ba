//go:build !unix

package fairqueue

import "time"

// processCPU is unknown here: benchmarks report wall time only.
func processCPU() time.Duration { return 0 }
