package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/sluice-io/sluice/internal/config"
)

// reloadDebounce coalesces the several events an editor's save produces.
const reloadDebounce = 100 * time.Millisecond

// Reloader reloads the configuration file into a Server when the file
// changes and on each value from Signals (SIGHUP). A file that fails to
// load is rejected: the server keeps the configuration it has, and the
// failure is logged and counted.
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
	// OnReload, if set, is called after each reload attempt with the new
	// configuration or the error that rejected it.
	OnReload func(*config.Config, error)

	watcher *fsnotify.Watcher
	abs     string
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
			rl.Reload("file changed")
		case <-rl.Signals:
			rl.Reload("signal")
		}
	}
}

// Reload loads the file now and swaps it in if it is valid.
func (rl *Reloader) Reload(reason string) {
	log := rl.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg, err := config.Load(rl.Path)
	rl.Server.m.ReloadResult(err, time.Now())
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			log.Error("config reload failed: file missing; keeping the running config", "file", rl.Path, "reason", reason)
		} else {
			log.Error("config reload rejected; keeping the running config", "file", rl.Path, "reason", reason, "err", err.Error())
		}
	} else {
		rl.Server.SetConfig(cfg)
		log.Info("config reloaded", "file", rl.Path, "reason", reason, "policies", len(cfg.Policies), "tiers", len(cfg.Tiers), "keys", len(cfg.Keys))
	}
	if rl.OnReload != nil {
		rl.OnReload(cfg, err)
	}
}
