// Package filewatch loads a configuration file when it changes, and only
// when it is whole.
//
// A file can change in two ways. It can be replaced: an editor's save, a
// `mv` of a finished file, Kubernetes' swap of a ConfigMap's ..data
// symlink. The new file is whole the moment it appears, so it is read at
// once (after Confirm, when a second read must agree with the first). Or
// it can be written in place, by a writer that may pause half-way: a
// valid YAML prefix that drops the config's last keys is a valid config,
// and loading it would refuse those keys' clients until the rest arrived.
// A file written in place is therefore read only once it has been still
// for Still after its last write event (2 s by default, longer than the
// pauses of a script, a slow pipe or an editor's save in pieces), and
// applied only when two reads Confirm apart agree on its size,
// modification time and content. A writer that pauses longer than Still
// in the middle of a file is not told from a finished one: that is the
// bound, and why tools should write a temporary file and rename it.
package filewatch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Defaults of Watcher's durations.
const (
	DefaultStill   = 2 * time.Second
	DefaultConfirm = 100 * time.Millisecond
)

// ErrTooLarge means the file is larger than Watcher.MaxBytes.
var ErrTooLarge = errors.New("filewatch: file too large")

// Watcher calls Apply with the file's content each time it changes and is
// whole (see the package comment), and on each value from Signals.
type Watcher struct {
	// Path is the file. Its directory is watched, since editors and
	// Kubernetes replace files rather than write them in place.
	Path string
	// MaxBytes bounds the file; a larger one is rejected (ErrTooLarge).
	MaxBytes int64
	// Signals asks for a reload on each value (SIGHUP), applied even when
	// the content is unchanged, once the file is whole.
	Signals <-chan os.Signal
	// Still is how long a file written in place must see no write before
	// it is read; zero means DefaultStill.
	Still time.Duration
	// Confirm is the time between the two reads that must agree; zero
	// means DefaultConfirm.
	Confirm time.Duration
	// Read, when not nil, reads the file instead of os.ReadFile (bounded
	// by MaxBytes all the same).
	Read func() ([]byte, error)
	// Last is the content the caller runs with: a change back to it, or an
	// event that leaves it as it is, reloads nothing.
	Last []byte
	// Apply is called, from Run's goroutine, with a whole file and why it
	// was read ("file changed" or "signal").
	Apply func(reason string, data []byte)
	// Reject is called when the file cannot be read (missing, too large).
	Reject func(reason string, err error)
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	watcher *fsnotify.Watcher
	abs     string
}

// Watch starts watching the file's directory; Run calls it if it has not
// been called. Calling it before Run makes sure that no change made after
// it returns is missed.
func (w *Watcher) Watch() error {
	if w.watcher != nil {
		return nil
	}
	abs, err := filepath.Abs(w.Path)
	if err != nil {
		return fmt.Errorf("filewatch: %w", err)
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("filewatch: %w", err)
	}
	if err := fw.Add(filepath.Dir(abs)); err != nil {
		fw.Close()
		return fmt.Errorf("filewatch: watch %s: %w", filepath.Dir(abs), err)
	}
	w.watcher, w.abs = fw, abs
	return nil
}

// Run applies changes and signals until ctx is done.
func (w *Watcher) Run(ctx context.Context) error {
	if err := w.Watch(); err != nil {
		return err
	}
	log := w.Logger
	if log == nil {
		log = slog.Default()
	}
	fw := w.watcher
	defer fw.Close()
	base := filepath.Base(w.abs)
	st := &settler{still: w.Still, confirm: w.Confirm}
	if st.still <= 0 {
		st.still = DefaultStill
	}
	if st.confirm <= 0 {
		st.confirm = DefaultConfirm
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	arm := func(at time.Time) { timer.Reset(max(0, time.Until(at))) }
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return nil
			}
			name := filepath.Base(ev.Name)
			if (name == base || name == "..data") && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename) != 0 {
				arm(st.event(ev.Op&fsnotify.Write != 0, time.Now()))
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return nil
			}
			log.Warn("config watch error", "file", w.Path, "err", err)
		case <-w.Signals:
			arm(st.signal(time.Now()))
		case <-timer.C:
			reason := "file changed"
			if st.signalled {
				reason = "signal"
			}
			data, mtime, err := w.read()
			if err != nil {
				st.reset()
				if w.Reject != nil {
					w.Reject(reason, err)
				}
				continue
			}
			now := time.Now()
			apply, next := st.fire(now, snapshotOf(data, mtime))
			if !apply {
				arm(next)
				continue
			}
			signalled := st.signalled
			st.reset()
			switch {
			case len(bytes.TrimSpace(data)) == 0:
				// Created, not yet written: a writer's open(O_CREAT)
				// before its first write. Never a config to run.
				log.Debug("config file is empty; waiting for its content", "file", w.Path)
			case bytes.Equal(data, w.Last) && !signalled:
				log.Debug("config file event without a change; nothing to reload", "file", w.Path)
			default:
				w.Last = data
				w.Apply(reason, data)
			}
		}
	}
}

// read reads the file, bounded by MaxBytes, with its modification time.
func (w *Watcher) read() ([]byte, time.Time, error) {
	var mtime time.Time
	if fi, err := os.Stat(w.Path); err == nil {
		mtime = fi.ModTime()
	}
	var data []byte
	var err error
	if w.Read != nil {
		data, err = w.Read()
	} else {
		data, err = readBounded(w.Path, w.MaxBytes)
	}
	if err != nil {
		return nil, mtime, err
	}
	if w.MaxBytes > 0 && int64(len(data)) > w.MaxBytes {
		return nil, mtime, fmt.Errorf("%w: %s: larger than %d bytes", ErrTooLarge, w.Path, w.MaxBytes)
	}
	return data, mtime, nil
}

// readBounded reads at most max+1 bytes of path (all of it when max <= 0).
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if max > 0 {
		r = io.LimitReader(f, max+1)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", path, err)
	}
	return data, nil
}

// snapshot is what two reads must agree on.
type snapshot struct {
	size  int
	mtime time.Time
	sum   [sha256.Size]byte
}

func snapshotOf(data []byte, mtime time.Time) snapshot {
	return snapshot{size: len(data), mtime: mtime, sum: sha256.Sum256(data)}
}

// settler decides, from the file's events and reads, when the file is
// whole. It is driven by Run with the time of each step, and by the tests
// with times of their own.
type settler struct {
	still, confirm time.Duration
	// lastWrite is the time of the last in-place write event since the
	// file was last applied; zero when there was none.
	lastWrite time.Time
	// pending is the first of the two reads that must agree.
	pending *snapshot
	// signalled: a signal asked for this reload.
	signalled bool
}

// event records a file event at now, an in-place write or a replacement
// (a rename or create in the directory), and returns when to read.
func (s *settler) event(write bool, now time.Time) time.Time {
	s.pending = nil
	if write {
		s.lastWrite = now
	}
	return s.readAt(now)
}

// signal records a reload signal at now and returns when to read.
func (s *settler) signal(now time.Time) time.Time {
	s.signalled, s.pending = true, nil
	return s.readAt(now)
}

// readAt is when to read next: once the last in-place write is Still old,
// and at once when there was none.
func (s *settler) readAt(now time.Time) time.Time {
	if !s.lastWrite.IsZero() {
		if at := s.lastWrite.Add(s.still); at.After(now) {
			return at
		}
	}
	return now
}

// fire takes a read of the file at now and says whether it is whole (to
// apply), or else when to read again.
func (s *settler) fire(now time.Time, snap snapshot) (apply bool, next time.Time) {
	if at := s.readAt(now); at.After(now) {
		return false, at // a write came in since the timer was set
	}
	if s.pending == nil || *s.pending != snap {
		s.pending = &snap
		return false, now.Add(s.confirm)
	}
	return true, time.Time{}
}

// reset forgets the reload in progress, once the file was applied or
// could not be read.
func (s *settler) reset() {
	s.lastWrite, s.pending, s.signalled = time.Time{}, nil, false
}
