//go:build !race

package rlqs_test

// raceEnabled: see race_test.go.
const raceEnabled = false
