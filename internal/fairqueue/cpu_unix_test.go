//go:build unix

package fairqueue

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user and system) the process has used: a
// benchmark's cost that other processes on a shared machine do not inflate
// the way they inflate its wall time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
