package gateway

// The Batch API under quotas (OpenAI's /v1/files with purpose "batch" and
// /v1/batches). Every client shares the gateway's one upstream key, and
// the provider shows every object under that key to every caller, so the
// gateway keeps ownership itself, with no state of its own:
//
//   - The ids a client sees are the provider's with a MAC of the client's
//     id appended ("batch_abc~3f2a…", keyed by the upstream key, so every
//     replica computes it): a file or batch id is accepted only from the
//     client it was issued to, and another key's look-up is 404.
//   - A batch carries its owner and reservation in its metadata (sluice_*
//     keys, hidden from the client): the batch list is the provider's,
//     filtered to the caller's own.
//
// A batch's enqueued prompt tokens, counted from its JSONL at creation,
// are held against the key's per-model batch queue (queue_tokens: a
// concurrency lease of that many units, keyed by the batch's reservation
// id) and its maximum cost at batch prices is reserved against the key's,
// team's and org's budgets, in one ApplyAll. When the gateway first sees
// the batch ended (completed, failed, expired or cancelled, on a
// retrieve, list or cancel), it settles once: the output file's usage is
// priced, the difference refunded (or charged), and the queue hold
// released, all in one refund batch that applies only while the hold's
// lease is held, so replicas settle a batch once. Each budget's refund
// names the window its charge was taken from (batchwindow.go).

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/aitoken"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

// BatchConfig is the `batches:` section: OpenAI's Batch API through the
// gateway, under quotas.
type BatchConfig struct {
	// Enabled serves /v1/files (purpose batch) and /v1/batches; without it
	// both are refused (404), as before.
	Enabled bool `yaml:"enabled"`
	// QueueTokens bounds each key's enqueued prompt tokens per model (or
	// "*" for every model not named), as OpenAI bounds an organization's;
	// a model with neither is unbounded.
	QueueTokens map[string]int64 `yaml:"queue_tokens"`
	// MaxFileBytes bounds an uploaded batch file; default and at most
	// OpenAI's own bound, 100 MB.
	MaxFileBytes int64 `yaml:"max_file_bytes"`
	// PricePercent is the batch price as a percentage of the model's
	// price; default 50 (OpenAI's and Azure's batch discount).
	PricePercent int64 `yaml:"price_percent"`
}

// Bounds of the Batch API, OpenAI's own (https://platform.openai.com/docs/guides/batch).
const (
	maxBatchFileBytes = 100 << 20
	maxBatchLines     = 50000
	batchHoldTTL      = 25 * time.Hour // the 24h completion window and an hour
	maxBatchMetadata  = 16
	batchPrefix       = "sluice_"
)

func (c *Config) checkBatches(doc *yamlconf.Doc) {
	b := &c.Batches
	if !b.Enabled {
		return
	}
	if len(c.Upstreams) > 0 {
		doc.Addf("batches.enabled", "batches need one upstream (upstream:), not a pool: a batch runs on one provider account")
	}
	if c.Upstream.API == APIAnthropic {
		doc.Addf("batches.enabled", "batches are OpenAI's Batch API; the upstream is anthropic")
	}
	if b.MaxFileBytes < 0 || b.MaxFileBytes > maxBatchFileBytes {
		doc.Addf("batches.max_file_bytes", "%d: between 1 and %d (OpenAI's bound)", b.MaxFileBytes, maxBatchFileBytes)
	}
	if b.PricePercent < 0 || b.PricePercent > 100 {
		doc.Addf("batches.price_percent", "%d: between 1 and 100", b.PricePercent)
	}
	if len(b.QueueTokens) > maxModels {
		doc.Addf("batches.queue_tokens", "%d models; at most %d", len(b.QueueTokens), maxModels)
	}
	for m, n := range b.QueueTokens {
		if n <= 0 {
			doc.Addf("batches.queue_tokens."+m, "%d must be positive", n)
		}
	}
}

// batchAPI serves the Batch API for a Gateway.
type batchAPI struct {
	g       *Gateway
	cfg     BatchConfig
	base    string // the upstream base URL, with its /v1
	client  *http.Client
	secret  []byte
	percent int64
	// files bounds the batch files held in memory at once (an upload, a
	// creation's count, a settlement's output), each up to MaxFileBytes:
	// clients sending many at once wait their turn or get 429, and cannot
	// fill the gateway's memory.
	files chan struct{}
	// settled remembers reservations this replica saw settled, so that a
	// client polling a finished batch (or a list of them) does not make
	// the gateway download its output each time. Bounded: cleared when
	// full, which costs a download and a refused refund, nothing more.
	mu      sync.Mutex
	settled map[string]struct{}
}

// Bounds of the batch files in memory: at most maxBatchFilesInMemory at
// once, waited for up to batchFileWait.
const (
	maxBatchFilesInMemory = 2
	batchFileWait         = 2 * time.Second
	maxSettledRemembered  = 4096
)

// holdFile takes a place for a batch file in memory, waiting up to
// batchFileWait; false means none came free.
func (b *batchAPI) holdFile(ctx context.Context) bool {
	t := time.NewTimer(batchFileWait)
	defer t.Stop()
	select {
	case b.files <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

func (b *batchAPI) dropFile() { <-b.files }

func (b *batchAPI) busy(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded", "",
		"The gateway is reading other batch files; please retry shortly.")
}

func (b *batchAPI) wasSettled(resv string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.settled[resv]
	return ok
}

func (b *batchAPI) markSettled(resv string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.settled) >= maxSettledRemembered {
		clear(b.settled)
	}
	b.settled[resv] = struct{}{}
}

func newBatchAPI(g *Gateway, transport http.RoundTripper) *batchAPI {
	cfg := g.cfg.Batches
	if cfg.MaxFileBytes == 0 {
		cfg.MaxFileBytes = maxBatchFileBytes
	}
	if cfg.PricePercent == 0 {
		cfg.PricePercent = 50
	}
	sum := sha256.Sum256([]byte("sluice batch ownership\x00" + g.upstreamKey))
	return &batchAPI{g: g, cfg: cfg, base: strings.TrimSuffix(g.cfg.Upstream.BaseURL, "/"),
		client: &http.Client{Transport: transport, Timeout: 5 * time.Minute}, secret: sum[:], percent: cfg.PricePercent,
		files: make(chan struct{}, maxBatchFilesInMemory), settled: map[string]struct{}{}}
}

// isBatchPath reports whether p is under /v1/files or /v1/batches.
func isBatchPath(p string) bool {
	return p == "/v1/files" || strings.HasPrefix(p, "/v1/files/") || p == "/v1/batches" || strings.HasPrefix(p, "/v1/batches/")
}

// sign is the id a client sees for the provider's id.
func (b *batchAPI) sign(cl *client, id string) string {
	m := hmac.New(sha256.New, b.secret)
	m.Write([]byte(cl.id + "\x00" + id))
	return id + "~" + hex.EncodeToString(m.Sum(nil)[:10])
}

// open returns the provider's id of an id the client was given, or false.
func (b *batchAPI) open(cl *client, id string) (string, bool) {
	i := strings.LastIndexByte(id, '~')
	if i <= 0 || len(id) > 256 {
		return "", false
	}
	raw := id[:i]
	return raw, hmac.Equal([]byte(b.sign(cl, raw)), []byte(id))
}

func (b *batchAPI) serve(w http.ResponseWriter, r *http.Request, cl *client) {
	parts := strings.Split(strings.Trim(strings.TrimPrefix(r.URL.Path, "/v1/"), "/"), "/")
	switch {
	case parts[0] == "files" && len(parts) == 1 && r.Method == http.MethodPost:
		b.upload(w, r, cl)
	case parts[0] == "files" && len(parts) == 1:
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "",
			"Listing files is not offered by the gateway: its upstream account holds every client's files. Keep the ids of the files you upload.")
	case parts[0] == "files" && len(parts) <= 3:
		b.file(w, r, cl, parts)
	case parts[0] == "batches" && len(parts) == 1 && r.Method == http.MethodPost:
		b.create(w, r, cl)
	case parts[0] == "batches" && len(parts) == 1 && r.Method == http.MethodGet:
		b.list(w, r, cl)
	case parts[0] == "batches" && (len(parts) == 2 && r.Method == http.MethodGet || len(parts) == 3 && parts[2] == "cancel" && r.Method == http.MethodPost):
		b.batch(w, r, cl, parts)
	default:
		unknownURL(w, r)
	}
}

// upstream sends a request to the provider with the gateway's key.
func (b *batchAPI) upstream(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, b.base+path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if b.g.upstreamKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.g.upstreamKey)
	}
	return b.client.Do(req)
}

// relayJSON reads the provider's JSON answer (bounded), lets fix rewrite
// it when it is a 2xx object, and sends it on.
func (b *batchAPI) relayJSON(w http.ResponseWriter, resp *http.Response, fix func(map[string]any)) {
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		b.unreachable(w, err)
		return
	}
	if resp.StatusCode/100 == 2 && fix != nil {
		var obj map[string]any
		if json.Unmarshal(body, &obj) == nil {
			fix(obj)
			body = marshalJSON(obj)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
}

func (b *batchAPI) unreachable(w http.ResponseWriter, err error) {
	b.g.log.Warn("gateway: batch API upstream failed", "err", err)
	writeError(w, http.StatusBadGateway, "server_error", "upstream_unreachable", "", "The upstream's Files or Batch API did not answer; retry later.")
}

// batchLine is what the gateway reads of a batch input line.
type batchLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// batchCount is what a batch input file holds.
type batchCount struct {
	lines    int
	model    string
	endpoint string
	prompt   int64 // enqueued prompt tokens
	maxOut   int64 // completion tokens reserved
}

// countBatch validates a JSONL input file and counts it: every line a
// POST to one metered endpoint with a unique custom_id, every body on one
// model. Errors name the line.
func (b *batchAPI) countBatch(content []byte) (batchCount, error) {
	var n batchCount
	seen := map[string]bool{}
	for i, line := range bytes.Split(content, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		n.lines++
		if n.lines > maxBatchLines {
			return n, fmt.Errorf("more than %d requests (OpenAI's bound per batch)", maxBatchLines)
		}
		var l batchLine
		if err := json.Unmarshal(line, &l); err != nil {
			return n, fmt.Errorf("line %d: not a JSON request line: %v", i+1, err)
		}
		if l.CustomID == "" || len(l.CustomID) > 512 || seen[l.CustomID] {
			return n, fmt.Errorf("line %d: custom_id must be set, unique and at most 512 characters", i+1)
		}
		seen[l.CustomID] = true
		if l.Method != http.MethodPost {
			return n, fmt.Errorf("line %d: method %q; batch requests are POST", i+1, truncateName(l.Method))
		}
		switch l.URL {
		case "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses":
		default:
			return n, fmt.Errorf("line %d: url %q is not a batch endpoint (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses)", i+1, truncateName(l.URL))
		}
		if n.endpoint == "" {
			n.endpoint = l.URL
		} else if l.URL != n.endpoint {
			return n, fmt.Errorf("line %d: url %s; a batch's requests all go to one endpoint (%s)", i+1, l.URL, n.endpoint)
		}
		var body struct {
			Model               string `json:"model"`
			MaxTokens           int64  `json:"max_tokens"`
			MaxCompletionTokens int64  `json:"max_completion_tokens"`
			MaxOutputTokens     int64  `json:"max_output_tokens"`
			N                   int64  `json:"n"`
		}
		if err := json.Unmarshal(l.Body, &body); err != nil || body.Model == "" {
			return n, fmt.Errorf("line %d: body must be a JSON request naming its model", i+1)
		}
		if n.model == "" {
			n.model = body.Model
		} else if body.Model != n.model {
			return n, fmt.Errorf("line %d: model %q; a batch's requests all use one model (%s)", i+1, truncateName(body.Model), truncateName(n.model))
		}
		var req aitoken.Request
		_ = json.Unmarshal(l.Body, &req)
		n.prompt = addSat(n.prompt, req.PromptTokens())
		if l.URL != "/v1/embeddings" {
			out := max(body.MaxTokens, body.MaxCompletionTokens, body.MaxOutputTokens)
			if out <= 0 {
				out = b.g.cfg.DefaultMaxTokens
			}
			n.maxOut = addSat(n.maxOut, min(out, 1<<24)*min(max(body.N, 1), 128))
		}
	}
	if n.lines == 0 {
		return n, errors.New("the file holds no requests")
	}
	return n, nil
}

func (b *batchAPI) upload(w http.ResponseWriter, r *http.Request, cl *client) {
	if !b.holdFile(r.Context()) {
		b.busy(w)
		return
	}
	defer b.dropFile()
	r.Body = http.MaxBytesReader(w, r.Body, b.cfg.MaxFileBytes+1<<20)
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "Upload a batch file as multipart/form-data with purpose=batch and file.")
		return
	}
	var purpose, filename string
	var content []byte
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "", "", fmt.Sprintf("The upload could not be read or is over %d bytes: %v", b.cfg.MaxFileBytes, err))
			return
		}
		switch p.FormName() {
		case "purpose":
			v, _ := io.ReadAll(io.LimitReader(p, 64))
			purpose = string(v)
		case "file":
			filename = p.FileName()
			content, err = io.ReadAll(io.LimitReader(p, b.cfg.MaxFileBytes+1))
			if err != nil || int64(len(content)) > b.cfg.MaxFileBytes {
				writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "", "file", fmt.Sprintf("A batch file through the gateway is at most %d bytes.", b.cfg.MaxFileBytes))
				return
			}
		}
	}
	if purpose != "batch" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "purpose",
			fmt.Sprintf("Only purpose \"batch\" files go through the gateway, not %q: other files would be shared with every client of its upstream account.", truncateName(purpose)))
		return
	}
	if _, err := b.countBatch(content); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_batch_file", "file", "The batch file is invalid: "+err.Error())
		return
	}
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", cmpOrString(filename, "batch.jsonl"))
	_, _ = fw.Write(content)
	_ = mw.Close()
	resp, err := b.upstream(r.Context(), http.MethodPost, "/files", &buf, mw.FormDataContentType())
	if err != nil {
		b.unreachable(w, err)
		return
	}
	b.relayJSON(w, resp, func(o map[string]any) { b.signField(cl, o, "id") })
}

func cmpOrString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (b *batchAPI) signField(cl *client, o map[string]any, k string) {
	if s, ok := o[k].(string); ok && s != "" {
		o[k] = b.sign(cl, s)
	}
}

func (b *batchAPI) notFound(w http.ResponseWriter, kind, id string) {
	writeError(w, http.StatusNotFound, "invalid_request_error", "", "", fmt.Sprintf("No such %s: %s", kind, truncateName(id)))
}

// file serves GET and DELETE /v1/files/{id} and GET its content.
func (b *batchAPI) file(w http.ResponseWriter, r *http.Request, cl *client, parts []string) {
	id, ok := b.open(cl, parts[1])
	if !ok {
		b.notFound(w, "file", parts[1])
		return
	}
	path := "/files/" + url.PathEscape(id)
	switch {
	case len(parts) == 3 && parts[2] == "content" && r.Method == http.MethodGet:
		resp, err := b.upstream(r.Context(), http.MethodGet, path+"/content", nil, "")
		if err != nil {
			b.unreachable(w, err)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	case len(parts) == 2 && (r.Method == http.MethodGet || r.Method == http.MethodDelete):
		resp, err := b.upstream(r.Context(), r.Method, path, nil, "")
		if err != nil {
			b.unreachable(w, err)
			return
		}
		b.relayJSON(w, resp, func(o map[string]any) { b.signField(cl, o, "id") })
	default:
		unknownURL(w, r)
	}
}

// download reads a file's content from the provider, bounded.
func (b *batchAPI) download(ctx context.Context, id string) ([]byte, error) {
	resp, err := b.upstream(ctx, http.MethodGet, "/files/"+url.PathEscape(id)+"/content", nil, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("file %s: upstream status %d", id, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBatchFileBytes*2+1))
	if err != nil {
		return nil, err
	}
	return body, nil
}

// hold is a batch's reservation as its metadata records it.
type hold struct {
	resv   string
	model  string
	tokens int64
	cost   int64 // micro-dollars reserved
	// ends are, by windowTag of a fixed-window budget's key, when the
	// window of its charge ends (Unix ms): batchwindow.go.
	ends map[string]int64
}

func (h hold) metadata() map[string]string {
	return map[string]string{batchPrefix + "resv": h.resv, batchPrefix + "model": h.model,
		batchPrefix + "tokens": strconv.FormatInt(h.tokens, 10), batchPrefix + "cost": h.costValue()}
}

func holdOf(md map[string]any) (hold, bool) {
	s := func(k string) string { v, _ := md[batchPrefix+k].(string); return v }
	h := hold{resv: s("resv"), model: s("model")}
	var err1, err2 error
	h.tokens, err1 = strconv.ParseInt(s("tokens"), 10, 64)
	err2 = h.parseCost(s("cost"))
	return h, h.resv != "" && err1 == nil && err2 == nil
}

// requests are the store requests of a batch's hold: the queue lease and
// the budgets that cover its model, each for cost micro-dollars.
func (b *batchAPI) requests(cl *client, h hold, cost int64) ([]sluice.Request, []*spec) {
	limit := b.cfg.QueueTokens[h.model]
	if limit == 0 {
		limit = b.cfg.QueueTokens["*"]
	}
	if limit == 0 {
		// No queue limit: the lease still makes settlement happen once.
		// sluice's largest rate (1<<50 was refused as an invalid limit:
		// every batch on a model without queue_tokens answered 503).
		limit = 1 << 40
	}
	reqs := []sluice.Request{{Key: cl.prefix + "bq:" + lengthPrefixed(h.model), Algorithm: sluice.Concurrency,
		Limit: sluice.Limit{Rate: limit, Period: batchHoldTTL}, Cost: max(h.tokens, 1), Lease: h.resv}}
	specs := []*spec{nil}
	if lv := cl.levels; lv != nil && cost > 0 {
		for i := range lv.specs {
			if s := &lv.specs[i]; s.kind == kindBudget && s.applies(h.model) {
				reqs = append(reqs, sluice.Request{Key: lv.keys[i], Algorithm: s.alg, Limit: s.limit, Cost: cost})
				specs = append(specs, s)
			}
		}
	}
	return reqs, specs
}

// batchCost is the batch price of usage on model, in micro-dollars.
func (b *batchAPI) batchCost(model string, u pricing.Usage) (int64, bool) {
	p, ok := b.g.prices.Lookup(model)
	if !ok {
		return 0, false
	}
	full := int64(p.Cost(u))
	return (full*b.percent + 99) / 100, true
}

func (b *batchAPI) create(w http.ResponseWriter, r *http.Request, cl *client) {
	var in struct {
		InputFileID      string            `json:"input_file_id"`
		Endpoint         string            `json:"endpoint"`
		CompletionWindow string            `json:"completion_window"`
		Metadata         map[string]string `json:"metadata"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&in); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "The body must be a JSON batch: input_file_id, endpoint, completion_window.")
		return
	}
	fileID, ok := b.open(cl, in.InputFileID)
	if !ok {
		b.notFound(w, "file", in.InputFileID)
		return
	}
	for k := range in.Metadata {
		if strings.HasPrefix(k, batchPrefix) {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "", "metadata", "metadata keys starting with "+batchPrefix+" are the gateway's.")
			return
		}
	}
	if len(in.Metadata) > maxBatchMetadata-4 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "metadata", fmt.Sprintf("At most %d metadata pairs through the gateway (it keeps 4 of the provider's 16).", maxBatchMetadata-4))
		return
	}
	if !b.holdFile(r.Context()) {
		b.busy(w)
		return
	}
	content, err := b.download(r.Context(), fileID)
	if err != nil {
		b.dropFile()
		b.unreachable(w, err)
		return
	}
	n, err := b.countBatch(content)
	content = nil
	b.dropFile()
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_batch_file", "input_file_id", "The batch file is invalid: "+err.Error())
		return
	}
	if in.Endpoint != n.endpoint {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "endpoint", fmt.Sprintf("endpoint %q, but the file's requests go to %s.", truncateName(in.Endpoint), n.endpoint))
		return
	}
	h := hold{resv: sluice.NewLeaseID(), model: n.model, tokens: n.prompt}
	if cl.levels != nil {
		cost, ok := b.batchCost(n.model, pricing.Usage{pricing.Input: n.prompt, pricing.Output: n.maxOut})
		if !ok && b.budgetApplies(cl, n.model) {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "model_not_priced", "", fmt.Sprintf("The model %q has no price in the gateway, so its batch cannot be charged to your budget.", truncateName(n.model)))
			return
		}
		h.cost = cost
	}
	reqs, specs := b.requests(cl, h, h.cost)
	if reqs[0].Cost > reqs[0].Limit.Rate {
		w.Header().Set("x-should-retry", "false")
		writeError(w, http.StatusBadRequest, "invalid_request_error", "token_limit_exceeded", "",
			fmt.Sprintf("This batch holds %d enqueued tokens for %s, more than your whole batch queue of %d. Split the file.", h.tokens, truncateName(n.model), reqs[0].Limit.Rate))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), b.g.cfg.Store.Timeout)
	ds, err := b.g.store.ApplyAll(ctx, sluice.OpAllow, reqs)
	cancel()
	if err != nil {
		b.g.log.Error("gateway: store unavailable", "client", cl.id, "err", err)
		statusUnavailable(w)
		return
	}
	// The settlement's refund names each budget's window (batchwindow.go).
	noteHoldWindows(&h, reqs, ds, b.g.now())
	for i, d := range ds {
		if d.Allowed {
			continue
		}
		w.Header().Set("x-should-retry", "false")
		if i == 0 {
			b.g.reportClient(cl, "batch_queue", 0)
			writeError(w, http.StatusTooManyRequests, "invalid_request_error", "token_limit_exceeded", "",
				fmt.Sprintf("Enqueued token limit reached for %s. Limit: %d enqueued tokens, %d in your batches in progress, this batch %d. Please try again once some in_progress batches have been completed.",
					truncateName(n.model), reqs[0].Limit.Rate, reqs[0].Limit.Rate-max(d.Remaining, 0), h.tokens))
			return
		}
		s := specs[i]
		b.g.reportClient(cl, s.reason(), d.RetryAfter)
		w.Header().Set("Retry-After", strconv.FormatInt(max(sluice.CeilSeconds(d.RetryAfter), 1), 10))
		writeError(w, http.StatusTooManyRequests, "insufficient_quota", "insufficient_quota", "",
			fmt.Sprintf("You exceeded your current quota: the %s budget of $%s per %s has $%s left, and this batch may cost up to $%s at batch prices.",
				s.scope(), pricing.Micros(s.limit.Rate), s.window, pricing.Micros(max(d.Remaining, 0)), pricing.Micros(h.cost)))
		return
	}
	b.g.reportClient(cl, "", 0)
	// The reservation and its owner ride in the provider's metadata (at
	// most 16 pairs: the client keeps 12).
	md := h.metadata()
	md[batchPrefix+"resv"] = h.resv + "." + cl.id
	for k, v := range in.Metadata {
		md[k] = v
	}
	body := marshalJSON(map[string]any{"input_file_id": fileID, "endpoint": in.Endpoint, "completion_window": cmpOrString(in.CompletionWindow, "24h"), "metadata": md})
	resp, err := b.upstream(r.Context(), http.MethodPost, "/batches", bytes.NewReader(body), "application/json")
	if err != nil || resp.StatusCode/100 != 2 {
		b.release(context.WithoutCancel(r.Context()), cl, h, 0, false)
		if err != nil {
			b.unreachable(w, err)
			return
		}
	}
	b.relayJSON(w, resp, func(o map[string]any) { b.forClient(cl, o) })
}

func (b *batchAPI) budgetApplies(cl *client, model string) bool {
	for i := range cl.levels.specs {
		if s := &cl.levels.specs[i]; s.kind == kindBudget && s.applies(model) {
			return true
		}
	}
	return false
}

// owner reads a batch's owner and hold from its metadata.
func ownerOf(o map[string]any) (string, hold, bool) {
	md, _ := o["metadata"].(map[string]any)
	h, ok := holdOf(md)
	if !ok {
		return "", h, false
	}
	resv, owner, found := strings.Cut(h.resv, ".")
	h.resv = resv
	return owner, h, found
}

// forClient rewrites a batch object for its owner: ids signed, the
// gateway's metadata taken out.
func (b *batchAPI) forClient(cl *client, o map[string]any) {
	for _, k := range []string{"id", "input_file_id", "output_file_id", "error_file_id"} {
		b.signField(cl, o, k)
	}
	if md, ok := o["metadata"].(map[string]any); ok {
		for k := range md {
			if strings.HasPrefix(k, batchPrefix) {
				delete(md, k)
			}
		}
	}
}

var batchEnded = map[string]bool{"completed": true, "failed": true, "expired": true, "cancelled": true}

// batch serves GET /v1/batches/{id} and POST /v1/batches/{id}/cancel.
func (b *batchAPI) batch(w http.ResponseWriter, r *http.Request, cl *client, parts []string) {
	id, ok := b.open(cl, parts[1])
	if !ok {
		b.notFound(w, "batch", parts[1])
		return
	}
	path := "/batches/" + url.PathEscape(id)
	method := http.MethodGet
	if len(parts) == 3 {
		path, method = path+"/cancel", http.MethodPost
	}
	resp, err := b.upstream(r.Context(), method, path, nil, "")
	if err != nil {
		b.unreachable(w, err)
		return
	}
	b.relayJSON(w, resp, func(o map[string]any) {
		b.settleIfEnded(r.Context(), cl, o)
		b.forClient(cl, o)
	})
}

// list serves GET /v1/batches: the provider's page, the caller's own.
func (b *batchAPI) list(w http.ResponseWriter, r *http.Request, cl *client) {
	q := url.Values{}
	if v, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && v >= 1 && v <= 100 {
		q.Set("limit", strconv.Itoa(v))
	}
	if a := r.URL.Query().Get("after"); a != "" {
		id, ok := b.open(cl, a)
		if !ok {
			b.notFound(w, "batch", a)
			return
		}
		q.Set("after", id)
	}
	resp, err := b.upstream(r.Context(), http.MethodGet, "/batches?"+q.Encode(), nil, "")
	if err != nil {
		b.unreachable(w, err)
		return
	}
	b.relayJSON(w, resp, func(o map[string]any) {
		data, _ := o["data"].([]any)
		mine := []any{}
		for _, d := range data {
			obj, _ := d.(map[string]any)
			if owner, _, ok := ownerOf(obj); ok && owner == cl.id {
				b.settleIfEnded(r.Context(), cl, obj)
				b.forClient(cl, obj)
				mine = append(mine, obj)
			}
		}
		// The provider's cursor continues after its last object, the
		// caller's or not: the page's last id is signed for this caller.
		if last, ok := o["last_id"].(string); ok && last != "" {
			o["last_id"] = b.sign(cl, last)
		}
		delete(o, "first_id")
		if len(mine) > 0 {
			o["first_id"] = mine[0].(map[string]any)["id"]
		}
		o["data"] = mine
	})
}

// settleIfEnded settles batch o once it has ended.
func (b *batchAPI) settleIfEnded(ctx context.Context, cl *client, o map[string]any) {
	status, _ := o["status"].(string)
	if !batchEnded[status] {
		return
	}
	owner, h, ok := ownerOf(o)
	if !ok || owner != cl.id || b.wasSettled(h.resv) {
		return
	}
	var actual int64
	priced := true
	if out, _ := o["output_file_id"].(string); out != "" {
		if !b.holdFile(ctx) {
			return // settled on a later look
		}
		content, err := b.download(ctx, out)
		if err == nil {
			actual, priced = b.outputCost(h.model, content)
		}
		b.dropFile()
		if err != nil {
			b.g.log.Warn("gateway: batch output unreadable; settling later", "client", cl.id, "err", err)
			return
		}
	}
	if !priced {
		actual = h.cost // no price: keep the reservation
	}
	if b.release(context.WithoutCancel(ctx), cl, h, actual, true) {
		b.markSettled(h.resv)
	}
}

// outputCost prices an output file's usage at batch prices.
func (b *batchAPI) outputCost(model string, content []byte) (int64, bool) {
	var prompt, cached, completion, reasoning int64
	for _, line := range bytes.Split(content, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var l struct {
			Response struct {
				StatusCode int `json:"status_code"`
				Body       struct {
					Usage usageJSON `json:"usage"`
				} `json:"body"`
			} `json:"response"`
		}
		if json.Unmarshal(line, &l) != nil || l.Response.StatusCode/100 != 2 {
			continue // failed lines cost nothing
		}
		u := l.Response.Body.Usage
		if u.negative() {
			continue
		}
		var d callBudget
		d.setDetails(&u)
		prompt = addSat(prompt, max(u.PromptTokens, u.InputTokens))
		completion = addSat(completion, max(u.CompletionTokens, u.OutputTokens))
		cached = addSat(cached, d.cached)
		reasoning = addSat(reasoning, d.reasoning)
	}
	return b.batchCost(model, pricing.OpenAIUsage(prompt, cached, completion, reasoning))
}

// release settles a hold: its budgets get reserved − actual back (or are
// charged the excess) and its queue lease is released, in one refund batch
// that applies only while the lease is held: once, across replicas.
// A budget's refund names the window of its charge, and is not sent once
// that window has ended (batchwindow.go). It reports whether the hold is
// settled now, by this call or before.
func (b *batchAPI) release(ctx context.Context, cl *client, h hold, actual int64, ended bool) bool {
	reqs, _ := b.requests(cl, h, h.cost)
	refunds := []sluice.Request{reqs[0]}
	var charges []sluice.Request
	now := b.g.now()
	lapsed := 0 // refunds not sent: their windows ended
	for _, q := range reqs[1:] {
		switch d := h.cost - actual; {
		case d > 0:
			ahead, gone := h.reservedAhead(&q, now)
			if gone {
				lapsed++
				continue
			}
			q.Cost, q.ReservedAhead = d, ahead
			refunds = append(refunds, q)
		case d < 0:
			q.Cost = -d
			charges = append(charges, q)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, b.g.cfg.Store.Timeout)
	defer cancel()
	held, err := b.refundHeld(ctx, refunds)
	if err != nil {
		b.g.log.Warn("gateway: batch settlement failed; the next look at the batch retries", "client", cl.id, "err", err)
		return false
	}
	if !held {
		return true // settled already, here or on another replica
	}
	if len(charges) > 0 {
		if _, err := b.g.store.ApplyAll(ctx, sluice.OpCharge, charges); err != nil {
			b.g.log.Warn("gateway: batch charge failed", "client", cl.id, "err", err)
		}
	}
	if ended {
		b.g.log.Info("gateway: batch settled", "client", cl.id, "model", h.model, "reserved_usd", pricing.Micros(h.cost).String(),
			"cost_usd", pricing.Micros(actual).String(), "refunds_of_ended_windows_dropped", lapsed)
	}
	return true
}

// refundHeld applies refunds (refunds[0] the hold's queue lease) while the
// lease is held, and reports whether it was: a second settlement (another
// replica's, or this one's once it forgot) is refused whole. A
// region.Store keeps that across regions too (region/refund.go: the
// lease's release first, the shares' refunds only from the call that
// released it).
func (b *batchAPI) refundHeld(ctx context.Context, refunds []sluice.Request) (bool, error) {
	ds, err := b.g.store.ApplyAll(ctx, sluice.OpRefund, refunds)
	if err != nil {
		return false, err
	}
	return ds[0].Allowed, nil
}
