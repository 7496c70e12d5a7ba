package filewatch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// stepper drives a settler through a timeline of its own, as Run does
// with the real clock: t0 is the first instant, and each step names its
// time.
type stepper struct {
	t  *testing.T
	s  *settler
	t0 time.Time
	at time.Time // when the settler wants the next read
}

func newStepper(t *testing.T) *stepper {
	return &stepper{t: t, s: &settler{still: DefaultStill, confirm: DefaultConfirm}, t0: time.Unix(1_700_000_000, 0)}
}

func (p *stepper) write(after time.Duration) { p.at = p.s.event(true, p.t0.Add(after)) }
func (p *stepper) rename(after time.Duration) {
	p.at = p.s.event(false, p.t0.Add(after))
}

// fire reads content at the instant the timer goes off and reports
// whether the settler applies it.
func (p *stepper) fire(content string, mtime time.Duration) bool {
	apply, next := p.s.fire(p.at, snapshotOf([]byte(content), p.t0.Add(mtime)))
	if apply {
		p.s.reset()
	} else {
		p.at = next
	}
	return apply
}

// TestHalfWrittenFileWaits: a writer writes a valid YAML prefix in place,
// pauses 0.7 s, then writes the rest (issue 38's writer). The prefix is
// never applied: the first read is set for Still after the first write,
// past the second write, which sets it again; the whole file is applied
// once two reads Confirm apart agree. Reading at the instants a naive
// "two reads agree" rule would (100 ms apart, from 100 ms after the
// event) would have applied the prefix.
func TestHalfWrittenFileWaits(t *testing.T) {
	const prefix, whole = "keys:\n  a: 1\n", "keys:\n  a: 1\n  b: 2\n"
	p := newStepper(t)
	p.write(0)
	if got := p.at.Sub(p.t0); got != DefaultStill {
		t.Fatalf("first read set %v after an in-place write; want %v", got, DefaultStill)
	}
	if DefaultStill <= 700*time.Millisecond {
		t.Fatalf("Still %v does not outlast the writer's 0.7 s pause", DefaultStill)
	}
	// The timer has not fired when the rest arrives 0.7 s later.
	p.write(700 * time.Millisecond)
	if got := p.at.Sub(p.t0); got != 700*time.Millisecond+DefaultStill {
		t.Fatalf("read set %v after the start; want Still after the last write", got)
	}
	if p.fire(whole, 700*time.Millisecond) {
		t.Fatal("applied on the first read, with nothing to agree with")
	}
	if !p.fire(whole, 700*time.Millisecond) {
		t.Fatal("two agreeing reads after Still without a write did not apply")
	}

	// A read that a timer set before a later write would make (Run's timer
	// raced the event) is not applied either: it waits for Still again.
	p = newStepper(t)
	p.write(0)
	p.at = p.t0.Add(100 * time.Millisecond) // a stale timer going off
	if p.fire(prefix, 0) || p.at != p.t0.Add(DefaultStill) {
		t.Fatalf("a read 100 ms after an in-place write was taken; next read at %v", p.at.Sub(p.t0))
	}
}

// TestChangedBetweenReadsWaits: two reads that differ in content, size
// or modification time are not a whole file; the second becomes the one
// to agree with.
func TestChangedBetweenReadsWaits(t *testing.T) {
	p := newStepper(t)
	p.write(0)
	if p.fire("a: 1\n", 0) || p.fire("a: 2\n", 0) {
		t.Fatal("applied a file whose content changed between the reads")
	}
	if p.fire("a: 2\n", time.Second) {
		t.Fatal("applied a file whose modification time changed between the reads")
	}
	if !p.fire("a: 2\n", time.Second) {
		t.Fatal("did not apply two agreeing reads")
	}
}

// TestRenameAppliesPromptly: a file renamed into place (an atomic
// replacement) is read at once and applied Confirm later, not Still.
func TestRenameAppliesPromptly(t *testing.T) {
	p := newStepper(t)
	p.rename(0)
	if p.at != p.t0 {
		t.Fatalf("read set %v after a rename; want at once", p.at.Sub(p.t0))
	}
	if p.fire("a: 1\n", 0) || !p.fire("a: 1\n", 0) || p.at.Sub(p.t0) != DefaultConfirm {
		t.Fatalf("a renamed file took until %v", p.at.Sub(p.t0))
	}
	// A rename while an in-place write is under way does not cut its wait.
	p = newStepper(t)
	p.write(0)
	p.rename(10 * time.Millisecond)
	if p.at != p.t0.Add(DefaultStill) {
		t.Fatalf("a rename cut short the wait of an in-place write: read at %v", p.at.Sub(p.t0))
	}
}

// TestRunAppliesWholeFile runs the watcher on a real directory: a file
// renamed into place is applied with its content (once), an empty file
// (created, not yet written) is not, and an in-place write is applied
// after Still (short here, to keep the test fast).
func TestRunAppliesWholeFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte("a: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	applied := make(chan string, 8)
	w := &Watcher{Path: path, MaxBytes: 1 << 20, Still: 300 * time.Millisecond, Last: []byte("a: 0\n"),
		Apply:  func(_ string, data []byte) { applied <- string(data) },
		Reject: func(_ string, err error) { t.Errorf("reject: %v", err) }}
	if err := w.Watch(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	next := func() string {
		t.Helper()
		select {
		case s := <-applied:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("nothing applied within 10s")
			return ""
		}
	}
	replace := func(content string) {
		tmp := filepath.Join(dir, ".tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	replace("")
	replace("a: 1\n")
	if got := next(); got != "a: 1\n" {
		t.Fatalf("applied %q", got)
	}
	if err := os.WriteFile(path, []byte("a: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "a: 2\n" {
		t.Fatalf("applied %q", got)
	}
	select {
	case s := <-applied:
		t.Fatalf("applied %q again", s)
	default:
	}
}
