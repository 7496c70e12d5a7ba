// Package console holds the parts of the operator's console that `sluice
// serve` shows at /ui: the page itself (HTML, CSS and JavaScript embedded
// with go:embed, no build step, no external assets), the fleet's decision
// counts behind its charts (Fleet, kept in the store per bucket so that
// every replica's decisions count), this replica's rate history (Series),
// and the fleet's top limited identities (Top, kept in the store too).
//
// The server (internal/server/console.go) serves the page and its JSON
// API; this package knows nothing of the server.
package console

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"
)

//go:embed assets
var assets embed.FS

// Assets returns the page's files: index.html, app.js, app.css.
func Assets() fs.FS {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return sub
}

// Defaults of Config.
const (
	DefaultSampleInterval = 5 * time.Second
	DefaultTopSample      = 16
	DefaultTopExact       = 100
	// Window is how far back the charts and the top list look.
	Window = 15 * time.Minute
)

// Config is the `console:` section of the service's config file.
type Config struct {
	// Enabled serves the console at /ui; it is off by default.
	Enabled bool `yaml:"enabled"`
	// SampleInterval is how often the replica's own chart gets a point
	// and the replica flushes its counts to the fleet charts (Fleet);
	// default 5s, from 100ms to 1m.
	SampleInterval time.Duration `yaml:"sample_interval"`
	// TopExact is how many denials of one identity under one policy a
	// replica counts one by one each second towards the top limited
	// identities; default 100, from 1 to 1048576.
	TopExact int `yaml:"top_exact"`
	// TopSample counts, past TopExact in a second, one denial in TopSample
	// (scaled back up, and the figure marked as estimated); default 16, 1
	// counts every denial.
	TopSample int `yaml:"top_sample"`
	// PublicRead serves the console's data (/ui/api/*) to whoever reaches
	// the listener; by default it takes an admin session (the admin token
	// exchanged for a cookie) or the admin token. Override reasons and
	// authors are shown to admins only, whatever this says.
	PublicRead bool `yaml:"public_read"`
}

// Validate checks the bounds and fills in the defaults.
func (c *Config) Validate() error {
	if c.SampleInterval == 0 {
		c.SampleInterval = DefaultSampleInterval
	}
	if c.TopSample == 0 {
		c.TopSample = DefaultTopSample
	}
	if c.TopExact == 0 {
		c.TopExact = DefaultTopExact
	}
	var errs []error
	if c.SampleInterval < 100*time.Millisecond || c.SampleInterval > time.Minute {
		errs = append(errs, fmt.Errorf("sample_interval %s must be from 100ms to 1m", c.SampleInterval))
	}
	if c.TopSample < 1 || c.TopSample > 1<<20 {
		errs = append(errs, fmt.Errorf("top_sample %d must be from 1 to %d", c.TopSample, 1<<20))
	}
	if c.TopExact < 1 || c.TopExact > 1<<20 {
		errs = append(errs, fmt.Errorf("top_exact %d must be from 1 to %d", c.TopExact, 1<<20))
	}
	return errors.Join(errs...)
}
