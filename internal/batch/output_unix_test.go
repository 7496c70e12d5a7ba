//go:build unix

package batch

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestOutputMustBeAFile: --output /dev/stdout, a FIFO or another device
// hung the run for ever before its first call, deaf to Ctrl-C and
// SIGTERM: reading the "file" back for a resume blocked on the pipe or
// the terminal. Such an output is refused now, with an error that says
// why: the output is the journal a rerun resumes from.
func TestOutputMustBeAFile(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	for _, path := range []string{fifo, "/dev/null"} {
		done := make(chan error, 1)
		go func() {
			out, _, err := OpenOutput(path, true, 10, nil)
			if err == nil {
				_ = out.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrOutputNotAFile) {
				t.Errorf("%s: err %v, want ErrOutputNotAFile", path, err)
			}
		case <-time.After(20 * time.Second): // a guard against the hang, not a timing
			t.Fatalf("%s: OpenOutput hangs", path)
		}
	}
}
