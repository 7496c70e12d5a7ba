package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/filewatch"
)

// ErrRestartRequired means a new configuration changes a setting that only
// takes effect on restart (the listen address, the store other than its
// failure policy, the envoy or gateway section). Such a configuration is rejected whole: a reload
// applies all of a file or none of it.
var ErrRestartRequired = errors.New("server: setting changed that takes a restart")

// Reloader reloads the configuration file into a Server when the file
// changes and on each value from Signals (SIGHUP). A file that fails to
// load, or that changes a setting only a restart applies, is rejected
// whole: the server keeps the configuration it has, and the failure is
// logged and counted.
type Reloader struct {
	// Path is the configuration file.
	Path string
	// Server receives each new configuration.
	Server *Server
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Signals triggers a reload on each value, for example SIGHUP from
	// signal.Notify.
	Signals <-chan os.Signal
	// Override, if set, adjusts each newly loaded configuration before it
	// is compared with the running one and applied, as the command line
	// adjusts the first one (--listen).
	Override func(*config.Config)
	// OnReload, if set, is called after each reload attempt with the new
	// configuration or the error that rejected it.
	OnReload func(*config.Config, error)

	fw *filewatch.Watcher
	// last is the content the service started with; a file event that
	// leaves the content as it was reloads nothing.
	last []byte
	// afterRead, if set, is called after each read of the file (tests).
	afterRead func(n int)
	// still, if not zero, replaces filewatch.DefaultStill (tests).
	still time.Duration
}

// Watch starts watching the file's directory; Run calls it if it has not
// been called. Calling it before Run makes sure that no change made after
// it returns is missed. When a change is read is package filewatch's
// matter: a file renamed into place at once, one written in place once it
// has been still for 2 s, and either only when two reads agree, so that a
// half-written file is never loaded.
func (rl *Reloader) Watch() error {
	if rl.fw == nil {
		rl.fw = &filewatch.Watcher{Path: rl.Path, MaxBytes: config.MaxFileBytes, Signals: rl.Signals, Still: rl.still,
			Read: rl.read, Last: rl.last, Apply: rl.apply, Reject: rl.reject, Logger: rl.Logger}
	}
	if err := rl.fw.Watch(); err != nil {
		return fmt.Errorf("server: reload: %w", err)
	}
	return nil
}

// Run reloads on changes and signals until ctx is done.
func (rl *Reloader) Run(ctx context.Context) error {
	if err := rl.Watch(); err != nil {
		return err
	}
	return rl.fw.Run(ctx)
}

// Reload loads the file now and swaps it in if it is valid.
func (rl *Reloader) Reload(reason string) {
	data, err := rl.read()
	if err != nil {
		rl.reject(reason, err)
		return
	}
	rl.apply(reason, data)
}

// read reads the file, bounded as config.Load bounds it.
func (rl *Reloader) read() ([]byte, error) {
	f, err := os.Open(rl.Path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, config.MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", rl.Path, err)
	}
	if rl.afterRead != nil {
		rl.afterRead(len(data))
	}
	if len(data) > config.MaxFileBytes {
		return nil, fmt.Errorf("%w: %s: larger than %d bytes", config.ErrInvalid, rl.Path, config.MaxFileBytes)
	}
	return data, nil
}

// apply parses data and swaps it in whole, or rejects it whole.
func (rl *Reloader) apply(reason string, data []byte) {
	cfg, err := config.Parse(rl.Path, data)
	if err == nil {
		if rl.Override != nil {
			rl.Override(cfg)
		}
		err = rl.Server.SetConfig(cfg)
	}
	if err != nil {
		rl.reject(reason, err)
		return
	}
	rl.Server.m.ReloadResult(nil, time.Now())
	rl.logger().Info("config reloaded", "file", rl.Path, "reason", reason, "policies", len(cfg.Policies), "tiers", len(cfg.Tiers), "keys", len(cfg.Keys))
	if rl.OnReload != nil {
		rl.OnReload(cfg, nil)
	}
}

// reject counts and logs a reload that changed nothing.
func (rl *Reloader) reject(reason string, err error) {
	rl.Server.m.ReloadResult(err, time.Now())
	log := rl.logger()
	switch {
	case errors.Is(err, os.ErrNotExist):
		log.Error("config reload failed: file missing; keeping the running config", "file", rl.Path, "reason", reason)
	case errors.Is(err, ErrRestartRequired):
		log.Error("config reload rejected: it changes a setting that takes a restart; keeping the running config, restart to apply the file", "file", rl.Path, "reason", reason, "err", err.Error())
	default:
		log.Error("config reload rejected; keeping the running config", "file", rl.Path, "reason", reason, "err", err.Error())
	}
	if rl.OnReload != nil {
		rl.OnReload(nil, err)
	}
}

func (rl *Reloader) logger() *slog.Logger {
	if rl.Logger == nil {
		return slog.Default()
	}
	return rl.Logger
}

// restartOnly lists the settings that differ between the running config
// and next and that only a restart applies.
func restartOnly(running, next *config.Config) []string {
	var out []string
	if running.Listen != next.Listen {
		out = append(out, "listen")
	}
	// The failure policy applies per call (each call uses the policy of
	// the config it loaded); the rest of the store section is fixed when
	// the store and its guard are built, and so are the policies' scopes
	// (store.GlobalPolicies: a policy's scope or home changed).
	rs, ns := running.Store, next.Store
	rs.FailurePolicy, ns.FailurePolicy = "", ""
	if !reflect.DeepEqual(rs, ns) {
		out = append(out, "store")
	}
	if running.File != nil && next.File != nil {
		if !reflect.DeepEqual(running.File.Envoy, next.File.Envoy) {
			out = append(out, "envoy")
		}
		if !reflect.DeepEqual(running.File.Gateway, next.File.Gateway) {
			out = append(out, "gateway")
		}
		// The quota service's section is applied live; adding or removing
		// it adds or removes a service of the gRPC server.
		if (running.File.RLQS == nil) != (next.File.RLQS == nil) {
			out = append(out, "rlqs (added or removed)")
		}
	}
	return out
}

// restartError is the error of a config that restartOnly rejects.
func restartError(changed []string) error {
	return fmt.Errorf("%w: %s changed; nothing was applied, restart sluice to apply the file", ErrRestartRequired, strings.Join(changed, ", "))
}
