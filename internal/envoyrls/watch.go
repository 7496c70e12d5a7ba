package envoyrls

import (
	"context"
	"fmt"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch reloads the configuration whenever a file in ConfigDir changes,
// until ctx is done. Changes that come in a burst are read once, ReloadDelay
// after the last. Writes, renames and Kubernetes' ConfigMap symlink swaps
// all count. A bad configuration is logged and the previous one is kept.
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
			timer.Reset(s.delay)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			s.log.Warn("envoyrls: config watch", "error", err)
			timer.Reset(s.delay) // events may have been lost: read again
		case <-timer.C:
			err := s.Reload()
			if s.onLoad != nil {
				s.onLoad(err)
			}
		}
	}
}
