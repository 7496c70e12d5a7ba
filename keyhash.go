package sluice

import (
	"crypto/sha256"
	"encoding/hex"
)

// HashKey returns the lowercase hex SHA-256 of an API key. sluice stores,
// logs and labels keys only in this form, never raw.
func HashKey(apiKey string) string {
	sum := sha256.Sum256([]byte(apiKey))
	return hex.EncodeToString(sum[:])
}
