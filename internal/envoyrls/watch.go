package envoyrls

import (
	"context"
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch reloads the configuration whenever a file in ConfigDir changes,
// until ctx is done. Changes that come in a burst are read once, ReloadDelay
// after the last. Writes, renames and Kubernetes' ConfigMap symlink swaps
// all count. A bad configuration is logged and the previous one is kept.
//
// A file written in place may be read half-written: a valid YAML prefix
// that drops a domain's last descriptors is a valid configuration. After
// a write the directory must be still for ReloadStill (2 s by default),
// and every reload reads the directory twice, ReloadDelay apart, and
// applies only when both reads agree (package filewatch's rule for the
// service's own file). A rename or a ConfigMap swap is read after
// ReloadDelay.
func (s *Service) Watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("envoyrls: watch config dir: %w", err)
	}
	defer w.Close()
	if err := w.Add(s.dir); err != nil {
		return fmt.Errorf("envoyrls: watch config dir: %w", err)
	}
	if s.watching != nil {
		s.watching()
	}
	var confirm *[sha256.Size]byte // the last read's digest, awaiting a second read
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
			if ev.Op == fsnotify.Chmod {
				continue
			}
			confirm = nil
			if ev.Op&fsnotify.Write != 0 {
				timer.Reset(max(s.delay, s.still))
			} else {
				timer.Reset(s.delay)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			s.log.Warn("envoyrls: config watch", "error", err)
			confirm = nil
			timer.Reset(s.delay) // events may have been lost: read again
		case <-timer.C:
			files, err := readDir(s.dir)
			if err == nil {
				sum := digest(files)
				if confirm == nil || *confirm != sum {
					// A first read, or one that differs from the last:
					// read again, and apply only when two agree.
					confirm = &sum
					timer.Reset(s.delay)
					continue
				}
			}
			confirm = nil
			err = s.load(files, err)
			if s.onLoad != nil {
				s.onLoad(err)
			}
		}
	}
}

// digest sums a directory's files, names and contents.
func digest(files []configFile) [sha256.Size]byte {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%d:%s:%d:", len(f.name), f.name, len(f.data))
		h.Write(f.data)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}
