//go:build race

package envoyrls

// raceEnabled: the race detector's shadow memory inflates every process's
// RSS, so the fairness tests then bound the Go runtime's memory alone.
const raceEnabled = true
