package batch

// The output file is the batch's journal. Each prompt that ends, answered or
// failed for good, becomes one JSON line written by a single write(2) of
// the whole line, then fsync'd: a crash leaves every line whole, or, on a
// power cut mid-write, at most a torn last line without its newline.
// Opening the file for a resume reads the ids already there and cuts such a
// torn tail off before appending, so the file always parses line by line;
// a last line that is a whole record missing only its newline is kept.
// A lock on the file keeps two processes from appending to it at once.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"github.com/sluice-io/sluice/aiclient"
)

// ErrOutputChanged means another process removed, replaced or truncated
// the output during the run: records written on would be lost.
var ErrOutputChanged = errors.New("batch: the output file was changed by another process")

// ErrOutputNotAFile means the output path names something other than a
// regular file, such as /dev/stdout or a FIFO: the output is the journal
// a rerun resumes from, read back before appending.
var ErrOutputNotAFile = errors.New("batch: the output must be a regular file")

// Status values of a Record.
const (
	StatusOK     = "ok"
	StatusFailed = "failed"
)

// maxRecordBytes bounds one output line read back on resume. A record
// holds an answer of at most the client's response bound (16 MiB by
// default), which Write encodes in at most twice its size: without HTML
// escaping, only a raw U+2028 or U+2029 (3 bytes) grows, to 6.
const maxRecordBytes = 64 << 20

// Record is one line of the output.
type Record struct {
	// ID is the prompt's id.
	ID string `json:"id"`
	// Line is the prompt's input line.
	Line int64 `json:"line"`
	// Status is StatusOK or StatusFailed.
	Status string `json:"status"`
	// Model is the model that answered, or was asked.
	Model string `json:"model,omitempty"`
	// Response is the first choice's text.
	Response string `json:"response,omitempty"`
	// ToolCalls is the first choice's tool calls, as the server sent them
	// (OpenAI's tool_calls array; Anthropic's tool_use content blocks).
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
	// Refusal is the first choice's refusal, for structured outputs.
	Refusal string `json:"refusal,omitempty"`
	// FinishReason is the first choice's finish reason.
	FinishReason string `json:"finish_reason,omitempty"`
	// OtherChoices holds the choices after the first, when the answer has
	// several (a prompt with "n"): paid for too. Not repeating the first
	// keeps a record within twice the response's size (maxRecordBytes).
	OtherChoices []Choice `json:"other_choices,omitempty"`
	// Error says why the prompt failed.
	Error string `json:"error,omitempty"`
	// HTTPStatus is the last failed attempt's status, when it had one.
	HTTPStatus int `json:"http_status,omitempty"`
	// Usage is the tokens the answer used.
	Usage *aiclient.Usage `json:"usage,omitempty"`
	// Attempts is the number of requests sent for the prompt in this run.
	Attempts int `json:"attempts"`
	// DurationMS is the time from launch to the end, waits included.
	DurationMS int64 `json:"duration_ms"`
}

// Choice is a choice of an answer after its first.
type Choice struct {
	// Response, ToolCalls, Refusal and FinishReason are as in Record.
	Response     string          `json:"response,omitempty"`
	ToolCalls    json.RawMessage `json:"tool_calls,omitempty"`
	Refusal      string          `json:"refusal,omitempty"`
	FinishReason string          `json:"finish_reason,omitempty"`
}

// idKey is the 128-bit hash an id is remembered by: the set of done ids
// costs the same for every id length.
type idKey [16]byte

func keyOf(id string) idKey {
	sum := sha256.Sum256([]byte(id))
	return idKey(sum[:16])
}

// Marks kept per id.
const (
	markOK     uint8 = 1 << iota // an ok record is in the output
	markFailed                   // a failed record is in the output
	markRun                      // launched in this run
)

// idSet remembers marks per id, for up to max ids.
type idSet struct {
	m   map[idKey]uint8
	max int
}

func newIDSet(max int) *idSet { return &idSet{m: make(map[idKey]uint8), max: max} }

// ErrTooManyIDs means the input or output holds more distinct ids than
// Config.MaxIDs allows.
var ErrTooManyIDs = errors.New("batch: too many distinct ids")

// mark sets marks on id.
func (s *idSet) mark(id string, marks uint8) error {
	k := keyOf(id)
	old, seen := s.m[k]
	if !seen && len(s.m) >= s.max {
		return fmt.Errorf("%w: more than %d", ErrTooManyIDs, s.max)
	}
	s.m[k] = old | marks
	return nil
}

// get returns the marks of id.
func (s *idSet) get(id string) uint8 { return s.m[keyOf(id)] }

// Output appends records to the output file. It is safe for concurrent use.
type Output struct {
	mu   sync.Mutex // guards f's offset and size
	f    *os.File
	size int64
	sync bool
	path string

	syncMu sync.Mutex // one fsync at a time
	synced int64      // offset known to be on disk; guarded by syncMu
}

// Resumed is what OpenOutput found in an existing output.
type Resumed struct {
	// OK and Failed count the ids already answered and failed.
	OK, Failed int64
	// TornBytes is the size of a torn last line that was cut off.
	TornBytes int64
	done      *idSet
	newline   bool // the last record lacks its newline
}

// OpenOutput opens or creates the output at path, locks it, reads back
// the ids it holds and cuts off a torn last line. With sync, every record
// is fsync'd. maxIDs bounds the ids remembered.
func OpenOutput(path string, sync bool, maxIDs int, log *slog.Logger) (*Output, *Resumed, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Not a device or a FIFO: opening one may block or act, and reading it
	// back for the resume would block for ever, deaf to Ctrl-C.
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%w: %s is a %s; give a file path", ErrOutputNotAFile, path, kindOf(st.Mode()))
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("batch: open output: %w", err)
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%w: %s changed into something else as it was opened", ErrOutputNotAFile, path)
	}
	if err := lockFile(f); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("batch: output %s is in use by another process: %w", path, err)
	}
	res := &Resumed{done: newIDSet(maxIDs)}
	good, err := readRecords(f, res)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("batch: output %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("batch: output %s: %w", path, err)
	}
	if st.Size() > good {
		res.TornBytes = st.Size() - good
		log.Warn("batch: cutting off a torn last line of the output", "path", path, "bytes", res.TornBytes)
		if err := f.Truncate(good); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("batch: output %s: cut torn line: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("batch: output %s: %w", path, err)
		}
	}
	if res.newline {
		if _, err := f.WriteAt([]byte{'\n'}, good); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("batch: output %s: end the last record: %w", path, err)
		}
		good++
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("batch: output %s: %w", path, err)
	}
	return &Output{f: f, size: good, sync: sync, path: path, synced: good}, res, nil
}

// kindOf names a file mode's type for an error message.
func kindOf(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "pipe"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeDevice != 0:
		return "device"
	case m.IsDir():
		return "directory"
	}
	return "special file"
}

// readRecords reads every complete line of f into res and returns the
// offset after the last one. A complete line that is not a record is an
// error: the file is not a batch output, and nothing is cut.
func readRecords(f *os.File, res *Resumed) (int64, error) {
	br := bufio.NewReaderSize(f, 1<<20)
	var off int64
	var line []byte
	lineNo := 0
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxRecordBytes {
			return 0, fmt.Errorf("line %d is longer than %d bytes", lineNo+1, maxRecordBytes)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if errors.Is(err, io.EOF) && len(bytes.TrimSpace(line)) > 0 && isRecord(line) {
			// A whole record without its newline, as a script or an
			// editor rewriting the file may leave it: not torn, keep it.
			// The caller adds the newline.
			line = append(line, '\n')
			res.newline = true
		}
		if len(line) > 0 && line[len(line)-1] == '\n' {
			lineNo++
			if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
				var rec struct{ ID, Status string }
				if json.Unmarshal(trimmed, &rec) != nil || rec.ID == "" {
					return 0, fmt.Errorf("line %d is not a batch record; refusing to append to it", lineNo)
				}
				// An ok line wins over failed ones, whatever the order:
				// a prompt retried with --retry-failed has both.
				was := res.done.get(rec.ID)
				mark := markFailed
				if rec.Status == StatusOK {
					mark = markOK
				}
				if err := res.done.mark(rec.ID, mark); err != nil {
					return 0, err
				}
				switch {
				case mark == markOK && was&markOK == 0:
					res.OK++
					if was&markFailed != 0 {
						res.Failed--
					}
				case mark == markFailed && was == 0:
					res.Failed++
				}
			}
			off += int64(len(line))
			line = line[:0]
		}
		if errors.Is(err, io.EOF) {
			if res.newline {
				off-- // the newline is not in the file yet
			}
			return off, nil // anything left in line is a torn tail
		}
	}
}

// isRecord reports whether b is one whole record.
func isRecord(b []byte) bool {
	var rec struct{ ID string }
	return json.Unmarshal(bytes.TrimSpace(b), &rec) == nil && rec.ID != ""
}

// Write appends rec as one line with one write, and fsyncs it when the
// output was opened with sync. If the write fails part-way, the partial
// line is cut off again.
func (o *Output) Write(rec *Record) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // '<' as 6 bytes would put a large answer past maxRecordBytes
	if err := enc.Encode(rec); err != nil {
		return fmt.Errorf("batch: encode record %q: %w", rec.ID, err)
	}
	b := buf.Bytes() // Encode ends it with '\n'
	o.mu.Lock()
	if err := o.stillOurs(); err != nil {
		o.mu.Unlock()
		return err
	}
	n, err := o.f.Write(b)
	if err != nil {
		if n > 0 {
			_ = o.f.Truncate(o.size)
			_, _ = o.f.Seek(o.size, io.SeekStart)
		}
		o.mu.Unlock()
		return fmt.Errorf("batch: write output %s: %w", o.path, err)
	}
	o.size += int64(n)
	end := o.size
	o.mu.Unlock()
	if o.sync {
		return o.syncTo(end)
	}
	return nil
}

// stillOurs checks, before a write, that the output path still names the
// file this Output holds, at the size it wrote: a record appended to a
// file removed or replaced since (an editor's save renames a new file over
// it; the lock does not stop that), or past the end of one truncated, would
// be lost. It costs two stat calls per record. The caller holds o.mu.
func (o *Output) stillOurs() error {
	held, err := o.f.Stat()
	if err != nil {
		return fmt.Errorf("batch: output %s: %w", o.path, err)
	}
	named, err := os.Stat(o.path)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %s is gone (%w); rerun to redo the prompts not recorded", ErrOutputChanged, o.path, err)
	case !os.SameFile(held, named):
		return fmt.Errorf("%w: %s was replaced by another file; rerun to redo the prompts not recorded", ErrOutputChanged, o.path)
	case held.Size() != o.size:
		return fmt.Errorf("%w: %s is %d bytes, not the %d written; rerun to redo the prompts not recorded", ErrOutputChanged, o.path, held.Size(), o.size)
	}
	return nil
}

// syncTo returns once the file is fsync'd at least up to offset end.
// Writers that wait here together share one fsync (a group commit), so
// many calls in flight do not queue one fsync each.
func (o *Output) syncTo(end int64) error {
	o.syncMu.Lock()
	defer o.syncMu.Unlock()
	if o.synced >= end {
		return nil
	}
	o.mu.Lock()
	target := o.size
	o.mu.Unlock()
	if err := o.f.Sync(); err != nil {
		return fmt.Errorf("batch: sync output %s: %w", o.path, err)
	}
	o.synced = target
	return nil
}

// Close syncs and closes the output, releasing its lock.
func (o *Output) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	serr := o.f.Sync()
	cerr := o.f.Close()
	if err := errors.Join(serr, cerr); err != nil {
		return fmt.Errorf("batch: close output %s: %w", o.path, err)
	}
	return nil
}
