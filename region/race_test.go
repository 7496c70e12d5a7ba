//go:build race

package region_test

// raceOn reports a run under the race detector.
const raceOn = true
