package redisstore

import (
	"fmt"

	"github.com/sluice-io/sluice"
)

// checkCalendar refuses calendar limits until the scripts support them.
func checkCalendar(req *sluice.Request) error {
	if !req.Limit.Calendar.IsZero() {
		return fmt.Errorf("redisstore: %w: calendar windows (%s)", ErrUnsupportedLimit, req.Limit)
	}
	return nil
}
