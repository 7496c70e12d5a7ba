//go:build !race

package envoyrls

// raceEnabled: see race_test.go.
const raceEnabled = false
