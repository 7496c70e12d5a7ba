//go:build unix

package batch

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive, non-blocking advisory lock on f. The kernel
// releases it when the process dies, also by SIGKILL.
func lockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}
