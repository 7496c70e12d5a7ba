package gateway

import (
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

// Requests per day as a calendar day: with a timezone (Limits.Timezone,
// TierConfig.Timezone or Config.Timezone), rpd is enforced by FixedWindow
// on sluice's calendar windows, so it resets at local midnight, whatever
// the UTC offset that day; without one it stays GCRA over a rolling 24
// hours.

// inZone returns l with Timezone defaulted to zone.
func (l Limits) inZone(zone string) Limits {
	if l.Timezone == "" {
		l.Timezone = zone
	}
	return l
}

// rpd returns the algorithm and limit of l.RPD. The zone was checked by
// checkTimezone; a zone that no longer loads keeps the rolling day.
func (l Limits) rpd() (sluice.Algorithm, sluice.Limit) {
	if l.Timezone != "" && l.RPD > 0 {
		if loc, err := sluice.LoadLocation(l.Timezone); err == nil {
			return sluice.FixedWindow, sluice.PerCalendar(l.RPD, sluice.Calendar{Unit: sluice.Day, Location: loc})
		}
	}
	return sluice.GCRA, sluice.Limit{Rate: l.RPD, Period: 24 * time.Hour}
}

// checkTimezone records a zone that is not an IANA time zone.
func checkTimezone(doc *yamlconf.Doc, path, zone string) {
	if zone == "" {
		return
	}
	if _, err := sluice.LoadLocation(zone); err != nil {
		doc.Addf(path, "%q is not an IANA time zone, such as Europe/Berlin or America/New_York", truncateName(zone))
	}
}
