//go:build !race

package memstore_test

const raceOn = false
