//go:build !unix

package batch

import "os"

// lockFile does nothing where flock(2) is missing.
func lockFile(*os.File) error { return nil }
