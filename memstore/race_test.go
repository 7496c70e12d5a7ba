//go:build race

package memstore_test

// raceOn: the race detector makes the store some twenty times slower, so
// the floods of the normal suite are smaller under it.
const raceOn = true
