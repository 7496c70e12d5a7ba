//go:build race

package rlqs_test

// raceEnabled: the race detector multiplies the Go side's cost (this
// server's and the flood's), so TestAbuse bounds the p99 more loosely.
const raceEnabled = true
