package fakeopenai

// Batches is OpenAI's Files and Batch APIs as documented
// (https://platform.openai.com/docs/api-reference/batch and /files): a
// JSONL input file uploaded with purpose "batch" (at most 50,000 requests,
// 100 MB), a batch created from it for one endpoint with completion_window
// "24h" and at most 16 metadata pairs (keys ≤ 64, values ≤ 512
// characters), retrieved, listed newest first with limit and after,
// cancelled; its output file holds one line per request with the
// response's usage. Every object lives under the one API key, so every
// caller sees every file and batch: the provider's own behaviour, which a
// gateway sharing one key must hide. Tests move batches along with
// Complete; the fake counts usage as OpenAI's batch output reports it.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BatchOptions configure Batches.
type BatchOptions struct {
	// APIKey, when set, is required as the bearer key.
	APIKey string
	// CompletionTokens is each output line's completion tokens; zero
	// means the request's max_tokens, else 16.
	CompletionTokens int
	// FailEvery makes every n-th request of a batch fail (an error file
	// line, no usage); zero fails none.
	FailEvery int
}

// Batches is a fake of the Files and Batch APIs on its own server.
type Batches struct {
	opts BatchOptions
	srv  *httptest.Server

	mu      sync.Mutex
	seq     int
	files   map[string]*batchFile
	batches map[string]*batchObj
	order   []string // batch ids, oldest first
	reads   int      // file contents read
}

type batchFile struct {
	obj     map[string]any
	content []byte
}

type batchObj struct {
	obj   map[string]any
	input string
}

// NewBatches starts the fake; the test's cleanup stops it.
func NewBatches(t testing.TB, opts BatchOptions) *Batches {
	b := &Batches{opts: opts, files: map[string]*batchFile{}, batches: map[string]*batchObj{}}
	b.srv = httptest.NewServer(b)
	t.Cleanup(b.srv.Close)
	return b
}

// URL is the server's base URL, without /v1.
func (b *Batches) URL() string { return b.srv.URL }

func (b *Batches) nextID(prefix string) string {
	b.seq++
	return fmt.Sprintf("%s_%06d", prefix, b.seq)
}

func (b *Batches) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if b.opts.APIKey != "" && r.Header.Get("Authorization") != "Bearer "+b.opts.APIKey {
		errorBody(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "fakeopenai: wrong key")
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	p := strings.TrimPrefix(r.URL.Path, "/v1")
	parts := strings.Split(strings.Trim(p, "/"), "/")
	switch {
	case r.Method == http.MethodPost && p == "/files":
		b.upload(w, r)
	case r.Method == http.MethodGet && p == "/files":
		var data []any
		for _, f := range b.files {
			data = append(data, f.obj)
		}
		writeJSON(w, map[string]any{"object": "list", "data": data, "has_more": false})
	case len(parts) == 2 && parts[0] == "files" && r.Method == http.MethodGet:
		if f := b.files[parts[1]]; f != nil {
			writeJSON(w, f.obj)
			return
		}
		notFound(w, "file", parts[1])
	case len(parts) == 2 && parts[0] == "files" && r.Method == http.MethodDelete:
		if b.files[parts[1]] == nil {
			notFound(w, "file", parts[1])
			return
		}
		delete(b.files, parts[1])
		writeJSON(w, map[string]any{"id": parts[1], "object": "file", "deleted": true})
	case len(parts) == 3 && parts[0] == "files" && parts[2] == "content" && r.Method == http.MethodGet:
		if f := b.files[parts[1]]; f != nil {
			b.reads++
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(f.content)
			return
		}
		notFound(w, "file", parts[1])
	case r.Method == http.MethodPost && p == "/batches":
		b.create(w, r)
	case r.Method == http.MethodGet && p == "/batches":
		b.list(w, r)
	case len(parts) == 2 && parts[0] == "batches" && r.Method == http.MethodGet:
		if o := b.batches[parts[1]]; o != nil {
			writeJSON(w, o.obj)
			return
		}
		notFound(w, "batch", parts[1])
	case len(parts) == 3 && parts[0] == "batches" && parts[2] == "cancel" && r.Method == http.MethodPost:
		o := b.batches[parts[1]]
		if o == nil {
			notFound(w, "batch", parts[1])
			return
		}
		if st := o.obj["status"]; st == "validating" || st == "in_progress" {
			// Cancelling takes a while (up to 10 minutes, the docs say):
			// the batch is "cancelling" until Complete ends it.
			o.obj["status"] = "cancelling"
			o.obj["cancelling_at"] = time.Now().Unix()
		}
		writeJSON(w, o.obj)
	default:
		errorBody(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "fakeopenai: unknown url "+r.URL.Path)
	}
}

func notFound(w http.ResponseWriter, kind, id string) {
	errorBody(w, http.StatusNotFound, "invalid_request_error", "", fmt.Sprintf("No such %s: %s", kind, id))
}

func (b *Batches) upload(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseMultipartForm(200 << 20); err != nil {
		errorBody(w, http.StatusBadRequest, "invalid_request_error", "", "fakeopenai: multipart: "+err.Error())
		return
	}
	purpose := r.FormValue("purpose")
	f, h, err := r.FormFile("file")
	if err != nil || purpose == "" {
		errorBody(w, http.StatusBadRequest, "invalid_request_error", "", "fakeopenai: file and purpose are required")
		return
	}
	content, _ := io.ReadAll(f)
	if purpose == "batch" && (len(content) > 100<<20 || bytes.Count(content, []byte("\n")) > 50000) {
		errorBody(w, http.StatusBadRequest, "invalid_request_error", "", "fakeopenai: a batch file holds at most 50,000 requests and 100 MB")
		return
	}
	id := b.nextID("file")
	obj := map[string]any{"id": id, "object": "file", "bytes": len(content), "created_at": time.Now().Unix(),
		"filename": h.Filename, "purpose": purpose, "status": "processed"}
	b.files[id] = &batchFile{obj: obj, content: content}
	writeJSON(w, obj)
}

func (b *Batches) create(w http.ResponseWriter, r *http.Request) {
	var req struct {
		InputFileID      string            `json:"input_file_id"`
		Endpoint         string            `json:"endpoint"`
		CompletionWindow string            `json:"completion_window"`
		Metadata         map[string]string `json:"metadata"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		errorBody(w, http.StatusBadRequest, "invalid_request_error", "", "fakeopenai: bad json: "+err.Error())
		return
	}
	if b.files[req.InputFileID] == nil {
		notFound(w, "file", req.InputFileID)
		return
	}
	if req.CompletionWindow != "24h" {
		errorBody(w, http.StatusBadRequest, "invalid_request_error", "", "completion_window must be 24h")
		return
	}
	if len(req.Metadata) > 16 {
		errorBody(w, http.StatusBadRequest, "invalid_request_error", "", "metadata: at most 16 pairs")
		return
	}
	for k, v := range req.Metadata {
		if len(k) > 64 || len(v) > 512 {
			errorBody(w, http.StatusBadRequest, "invalid_request_error", "", "metadata: keys of at most 64 and values of at most 512 characters")
			return
		}
	}
	id := b.nextID("batch")
	var md any
	if req.Metadata != nil {
		md = req.Metadata
	}
	obj := map[string]any{"id": id, "object": "batch", "endpoint": req.Endpoint, "input_file_id": req.InputFileID,
		"completion_window": "24h", "status": "validating", "output_file_id": nil, "error_file_id": nil,
		"created_at": time.Now().Unix(), "metadata": md, "request_counts": map[string]any{"total": 0, "completed": 0, "failed": 0}}
	b.batches[id] = &batchObj{obj: obj, input: req.InputFileID}
	b.order = append(b.order, id)
	writeJSON(w, obj)
}

func (b *Batches) list(w http.ResponseWriter, r *http.Request) {
	limit := 20
	if v, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && v >= 1 && v <= 100 {
		limit = v
	}
	ids := append([]string(nil), b.order...)
	sort.Sort(sort.Reverse(sort.StringSlice(ids))) // newest first
	if after := r.URL.Query().Get("after"); after != "" {
		for i, id := range ids {
			if id == after {
				ids = ids[i+1:]
				break
			}
		}
	}
	more := len(ids) > limit
	ids = ids[:min(limit, len(ids))]
	data := []any{}
	for _, id := range ids {
		data = append(data, b.batches[id].obj)
	}
	body := map[string]any{"object": "list", "data": data, "has_more": more}
	if len(ids) > 0 {
		body["first_id"], body["last_id"] = ids[0], ids[len(ids)-1]
	}
	writeJSON(w, body)
}

// Complete runs batch id: every request of its input file gets an output
// line with usage (prompt tokens by CountPromptTokens, completion tokens
// as configured), or an error line for every FailEvery-th; a batch being
// cancelled ends "cancelled" with what it had done (nothing, here).
func (b *Batches) Complete(id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.batches[id]
	if o == nil {
		return fmt.Errorf("fakeopenai: no batch %s", id)
	}
	if o.obj["status"] == "cancelling" {
		o.obj["status"] = "cancelled"
		return nil
	}
	var out, errs bytes.Buffer
	var total, done, failed int
	for _, line := range bytes.Split(b.files[o.input].content, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		total++
		var req struct {
			CustomID string          `json:"custom_id"`
			Body     json.RawMessage `json:"body"`
		}
		_ = json.Unmarshal(line, &req)
		if b.opts.FailEvery > 0 && total%b.opts.FailEvery == 0 {
			failed++
			fmt.Fprintf(&errs, `{"id":"req_%d","custom_id":%q,"response":null,"error":{"code":"invalid_request","message":"failed"}}`+"\n", total, req.CustomID)
			continue
		}
		var body struct {
			Model     string `json:"model"`
			MaxTokens int    `json:"max_tokens"`
		}
		_ = json.Unmarshal(req.Body, &body)
		prompt := CountPromptTokens(req.Body)
		completion := b.opts.CompletionTokens
		if completion == 0 {
			completion = cmpOr(body.MaxTokens, 16)
		}
		done++
		resp, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("req_%d", total), "custom_id": req.CustomID,
			"response": map[string]any{"status_code": 200, "request_id": fmt.Sprintf("r%d", total), "body": map[string]any{
				"id": "chatcmpl-batch", "object": "chat.completion", "model": body.Model,
				"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": "ok"}, "finish_reason": "stop"}},
				"usage":   map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
			}}, "error": nil})
		out.Write(append(resp, '\n'))
	}
	if out.Len() > 0 {
		fid := b.nextID("file")
		b.files[fid] = &batchFile{obj: map[string]any{"id": fid, "object": "file", "bytes": out.Len(), "purpose": "batch_output", "status": "processed", "filename": "batch_output.jsonl"}, content: out.Bytes()}
		o.obj["output_file_id"] = fid
	}
	if errs.Len() > 0 {
		fid := b.nextID("file")
		b.files[fid] = &batchFile{obj: map[string]any{"id": fid, "object": "file", "bytes": errs.Len(), "purpose": "batch_output", "status": "processed", "filename": "batch_errors.jsonl"}, content: errs.Bytes()}
		o.obj["error_file_id"] = fid
	}
	o.obj["status"] = "completed"
	o.obj["completed_at"] = time.Now().Unix()
	o.obj["request_counts"] = map[string]any{"total": total, "completed": done, "failed": failed}
	return nil
}

// Reads is the number of file contents read (GET /v1/files/{id}/content).
func (b *Batches) Reads() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reads
}

// Count is the number of batches created.
func (b *Batches) Count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.batches)
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}
