package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"

	"github.com/sluice-io/sluice/aiclient"
)

// DefaultMaxLineBytes bounds one input line.
const DefaultMaxLineBytes = 8 << 20

// Prompt is one unit of work read from the input.
type Prompt struct {
	// ID identifies the prompt in the output; resume skips ids done.
	ID string
	// Line is the input line number, from 1.
	Line int64
	// Request is the chat request to send.
	Request aiclient.ChatRequest
	// Err, when set, means the line could not be read as a prompt; it is
	// reported as failed without calling the API.
	Err error
}

// Reader streams prompts from an input: JSONL objects or plain text lines,
// one prompt per line, blank lines skipped. It holds one line at a time.
//
// A JSON line is an object with "messages" (OpenAI chat messages) or
// "prompt" (a user message), and optionally "id" (a string or number;
// "line-N" by default), "system" (a system message before a prompt),
// "model", "max_tokens", and any further request parameters such as
// "temperature", passed through. Any other line is a prompt in plain text
// with the id "line-N". A line that is not UTF-8 text (a NUL byte, invalid
// UTF-8) is not a prompt.
type Reader struct {
	br        *bufio.Reader
	buf       []byte // the line being read
	maxLine   int
	line      int64
	model     string
	maxTokens int64
}

// NewReader reads prompts from r. model and maxTokens are the defaults for
// lines that name none; maxLine bounds a line (DefaultMaxLineBytes when 0).
func NewReader(r io.Reader, model string, maxTokens int64, maxLine int) *Reader {
	if maxLine <= 0 {
		maxLine = DefaultMaxLineBytes
	}
	return &Reader{br: bufio.NewReaderSize(r, min(64<<10, maxLine)), maxLine: maxLine, model: model, maxTokens: maxTokens}
}

// Next returns the next prompt, or io.EOF after the last. A line that is
// not a valid prompt, or is longer than the bound (its id unread, it is
// line-N), comes back with Err set; a read error ends the input with an
// error.
func (r *Reader) Next() (Prompt, error) {
	for {
		b, tooLong, err := r.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return Prompt{}, io.EOF
			}
			return Prompt{}, fmt.Errorf("batch: read input: %w", err)
		}
		r.line++
		if tooLong {
			return Prompt{ID: "line-" + strconv.FormatInt(r.line, 10), Line: r.line,
				Err: fmt.Errorf("batch: line %d is longer than the line limit of %d bytes (raise --max-line-bytes, and rerun with --retry-failed)", r.line, r.maxLine)}, nil
		}
		if r.line == 1 {
			b = bytes.TrimPrefix(b, []byte("\uFEFF")) // a byte order mark, as Windows editors write
		}
		b = bytes.TrimSpace(b)
		if len(b) == 0 {
			continue
		}
		return r.parse(b), nil
	}
}

// readLine reads the next line, without its line ending. A line longer
// than maxLine is read to its end but not kept: tooLong reports it. After
// the last line it returns io.EOF.
func (r *Reader) readLine() (b []byte, tooLong bool, err error) {
	r.buf = r.buf[:0]
	read := false
	for {
		chunk, err := r.br.ReadSlice('\n')
		read = read || len(chunk) > 0
		if !tooLong && len(r.buf)+len(chunk) > r.maxLine+2 { // +2: the line's "\r\n"
			tooLong, r.buf = true, r.buf[:0]
		}
		if !tooLong {
			r.buf = append(r.buf, chunk...)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && !read:
			return nil, false, io.EOF
		case err != nil && !errors.Is(err, io.EOF):
			return nil, false, err
		}
		line := bytes.TrimSuffix(bytes.TrimSuffix(r.buf, []byte("\n")), []byte("\r"))
		if !tooLong && len(line) > r.maxLine {
			tooLong = true
		}
		return line, tooLong, nil
	}
}

// Line is the number of the last line read.
func (r *Reader) Line() int64 { return r.line }

func (r *Reader) parse(b []byte) Prompt {
	p := Prompt{ID: "line-" + strconv.FormatInt(r.line, 10), Line: r.line}
	p.Request.Model, p.Request.MaxTokens = r.model, r.maxTokens
	if !utf8.Valid(b) || bytes.IndexByte(b, 0) >= 0 {
		// Sent, every bad byte would be U+FFFD: a prompt nobody wrote,
		// and paid for. Likely a Latin-1, compressed or binary file.
		p.Err = fmt.Errorf("batch: line %d is not UTF-8 text (a NUL byte or invalid UTF-8: a binary or compressed file, or another encoding?)", r.line)
		return p
	}
	if b[0] != '{' {
		p.Request.Messages = []aiclient.Message{{Role: "user", Content: string(b)}}
		if r.model == "" {
			p.Err = fmt.Errorf("%w: line %d is plain text", ErrNoModel, r.line)
		}
		return p
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		p.Err = fmt.Errorf("batch: line %d: not a JSON object: %w", r.line, err)
		return p
	}
	bad := func(format string, args ...any) Prompt {
		p.Err = fmt.Errorf("batch: line %d: "+format, append([]any{r.line}, args...)...)
		return p
	}
	if raw, ok := fields["id"]; ok {
		var s string
		var n json.Number
		switch {
		case json.Unmarshal(raw, &s) == nil && s != "":
			p.ID = s
		case json.Unmarshal(raw, &n) == nil:
			p.ID = n.String()
		default:
			return bad("id must be a non-empty string or a number")
		}
		if len(p.ID) > 1024 {
			return bad("id longer than 1024 bytes")
		}
	}
	if raw, ok := fields["model"]; ok {
		if json.Unmarshal(raw, &p.Request.Model) != nil || p.Request.Model == "" {
			return bad("model must be a non-empty string")
		}
	}
	if raw, ok := fields["max_tokens"]; ok {
		if json.Unmarshal(raw, &p.Request.MaxTokens) != nil || p.Request.MaxTokens <= 0 {
			return bad("max_tokens must be a positive integer")
		}
	}
	msgs, hasMsgs := fields["messages"]
	prompt, hasPrompt := fields["prompt"]
	switch {
	case hasMsgs && hasPrompt:
		return bad(`give "messages" or "prompt", not both`)
	case hasMsgs:
		if err := json.Unmarshal(msgs, &p.Request.Messages); err != nil || len(p.Request.Messages) == 0 {
			return bad(`"messages" must be a non-empty array of chat messages`)
		}
	case hasPrompt:
		var text string
		if json.Unmarshal(prompt, &text) != nil || text == "" {
			return bad(`"prompt" must be a non-empty string`)
		}
		if raw, ok := fields["system"]; ok {
			var sys string
			if json.Unmarshal(raw, &sys) != nil {
				return bad(`"system" must be a string`)
			}
			p.Request.Messages = append(p.Request.Messages, aiclient.Message{Role: "system", Content: sys})
		}
		p.Request.Messages = append(p.Request.Messages, aiclient.Message{Role: "user", Content: text})
	default:
		return bad(`needs "messages" or "prompt"`)
	}
	if p.Request.Model == "" {
		p.Err = fmt.Errorf("%w: line %d has no \"model\" field", ErrNoModel, r.line)
		return p
	}
	for k, v := range fields {
		switch k {
		case "id", "model", "max_tokens", "messages", "prompt", "system", "stream":
			continue
		}
		if p.Request.Params == nil {
			p.Request.Params = map[string]json.RawMessage{}
		}
		p.Request.Params[k] = v
	}
	return p
}

// CountPrompts counts the non-blank lines of r, for the progress bar's
// total. It streams, holding one buffer.
func CountPrompts(r io.Reader) (int64, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	var n int64
	blank := true
	for {
		chunk, err := br.ReadSlice('\n')
		for _, c := range chunk {
			switch c {
			case '\n':
				if !blank {
					n++
				}
				blank = true
			case ' ', '\t', '\r':
			default:
				blank = false
			}
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if !blank {
				n++
			}
			return n, nil
		default:
			return n, fmt.Errorf("batch: count input: %w", err)
		}
	}
}
