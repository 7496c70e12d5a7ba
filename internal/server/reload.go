package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/sluice-io/sluice/internal/config"
)

// Reload timing. A file event starts a quiet period of reloadDebounce,
// restarted by each further event, which coalesces the several events of
// one save. Then the file is read until two reads reloadSettle apart agree,
// so that a file still being written (in place, by a slow writer) is never
// loaded half-written. A signal reads at once, then waits for agreement
// the same way.
const (
	reloadDebounce = 100 * time.Millisecond
	reloadSettle   = 100 * time.Millisecond
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

	watcher *fsnotify.Watcher
	abs     string
	// last is the content last loaded or rejected; a file event that
	// leaves the content as it was reloads nothing. Run (the service) sets
	// it to the content it started with.
	last []byte
	// afterRead, if set, is called after each read of the file (tests).
	afterRead func(n int)
}

// Watch starts watching the file's directory; Run calls it if it has not
// been called. Calling it before Run makes sure that no change made after
// it returns is missed. It watches the directory rather than the file,
// because editors and Kubernetes replace files rather than write them in
// place.
func (rl *Reloader) Watch() error {
	if rl.watcher != nil {
		return nil
	}
	abs, err := filepath.Abs(rl.Path)
	if err != nil {
		return fmt.Errorf("server: reload: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("server: reload: %w", err)
	}
	if err := w.Add(filepath.Dir(abs)); err != nil {
		w.Close()
		return fmt.Errorf("server: reload: watch %s: %w", filepath.Dir(abs), err)
	}
	rl.watcher, rl.abs = w, abs
	return nil
}

// Run reloads on changes and signals until ctx is done.
func (rl *Reloader) Run(ctx context.Context) error {
	if rl.Logger == nil {
		rl.Logger = slog.Default()
	}
	if err := rl.Watch(); err != nil {
		return err
	}
	w, abs := rl.watcher, rl.abs
	defer w.Close()
	base := filepath.Base(abs)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var pending []byte // the previous read while waiting for the file to settle
	reading := false
	signalled := false // a signal asked for this reload: apply even an unchanged file
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			name := filepath.Base(ev.Name)
			if (name == base || name == "..data") && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename) != 0 {
				timer.Reset(reloadDebounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			rl.Logger.Warn("config watch error", "err", err)
		case <-timer.C:
			reason := "file changed"
			if signalled {
				reason = "signal"
			}
			data, err := rl.read()
			if err != nil {
				pending, reading, signalled = nil, false, false
				rl.reject(reason, err)
				continue
			}
			if !reading || !bytes.Equal(data, pending) {
				// First read, or the file changed since the last one:
				// read again once it has had time to settle.
				pending, reading = data, true
				timer.Reset(reloadSettle)
				continue
			}
			pending, reading = nil, false
			if bytes.Equal(data, rl.last) && !signalled {
				rl.Logger.Debug("config file event without a change; nothing to reload", "file", rl.Path)
				continue
			}
			signalled = false
			rl.apply(reason, data)
		case <-rl.Signals:
			// Read as after a file event, until two reads reloadSettle
			// apart agree: a signal sent while the file is being written
			// in place (a deploy tool's write and kill -HUP in one breath)
			// would otherwise load what was written so far, which may be
			// a valid config of fewer keys, tiers or tiers' policies.
			pending, reading, signalled = nil, false, true
			timer.Reset(0)
		}
	}
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
	rl.last = data
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
	}
	return out
}

// restartError is the error of a config that restartOnly rejects.
func restartError(changed []string) error {
	return fmt.Errorf("%w: %s changed; nothing was applied, restart sluice to apply the file", ErrRestartRequired, strings.Join(changed, ", "))
}
