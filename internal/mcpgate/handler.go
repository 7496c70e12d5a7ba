package mcpgate

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice"
)

// Options configure a Handler. Servers, Store and Auth are required.
type Options struct {
	// Servers are the validated mcp_servers entries.
	Servers []ServerConfig
	// Store keeps the counters; share one among gateway replicas so that
	// a key's limits hold across them.
	Store sluice.Store
	// Auth maps a request to its client, or ok false when the request
	// carries no valid key.
	Auth func(r *http.Request) (c Client, ok bool)
	// Getenv reads the servers' credential variables; nil means none are
	// set.
	Getenv func(string) string
	// Client sends requests to the servers; nil means a client without a
	// timeout (a server's event stream lasts as long as its session).
	Client *http.Client
	// MaxBodyBytes bounds a POST body; zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxInFlightPerKey bounds one key's requests at the servers at once;
	// zero means DefaultMaxInFlightPerKey.
	MaxInFlightPerKey int
	// LeaseTTL bounds a concurrency slot's life when the gateway holding
	// it dies; zero means DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives upstream errors; nil discards.
	Logger *slog.Logger
}

// Client is an authenticated caller.
type Client interface {
	// ID names the client in logs and in its sessions' ids; never the
	// key itself.
	ID() string
	// Prefix is the start of the client's store keys, with its hash tag:
	// the calls' counters join Charges in one atomic ApplyAll, on one
	// Redis Cluster slot.
	Prefix() string
	// Charges are further requests the tool calls of r add to their
	// limits, all or nothing: calls tools/call of a total cost (in
	// micro-dollars) against the client's budgets and its session's. An
	// error refuses the request as invalid, with its message.
	Charges(r *http.Request, calls int, cost int64) ([]sluice.Request, error)
	// Decided is told how a POST with tool calls was decided: admitted
	// when limit is "", else refused by that limit, named per server and
	// tool ("mcp:github/search_code:rpm", a tool not configured being
	// "other"; "mcp_budget" for the client's budgets) with a wait of retry.
	Decided(limit string, retry time.Duration)
}

// Handler serves /mcp/{server}. It is safe for concurrent use.
type Handler struct {
	servers  map[string]*server
	store    sluice.Store
	auth     func(*http.Request) (Client, bool)
	client   *http.Client
	maxBody  int64
	leaseTTL time.Duration
	calls    *prometheus.CounterVec
	log      *slog.Logger

	mu          sync.Mutex
	inFlight    map[string]int // requests at the servers per client (forward)
	maxInFlight int
}

type server struct {
	cfg     ServerConfig
	headers http.Header // the gateway's credentials for it
}

// New returns a Handler for the servers.
func New(opts Options) (*Handler, error) {
	if err := Validate(opts.Servers); err != nil {
		return nil, err
	}
	if opts.Store == nil || opts.Auth == nil {
		return nil, errors.New("mcpgate: New needs a Store and an Auth")
	}
	h := &Handler{
		servers:  map[string]*server{},
		store:    opts.Store,
		auth:     opts.Auth,
		client:   opts.Client,
		maxBody:  opts.MaxBodyBytes,
		leaseTTL: opts.LeaseTTL,
		log:      opts.Logger,
		inFlight: map[string]int{},
	}
	h.maxInFlight = cmp.Or(opts.MaxInFlightPerKey, DefaultMaxInFlightPerKey)
	if h.client == nil {
		h.client = &http.Client{}
	}
	if h.maxBody <= 0 {
		h.maxBody = DefaultMaxBodyBytes
	}
	if h.leaseTTL <= 0 {
		h.leaseTTL = DefaultLeaseTTL
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	getenv := opts.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	for _, s := range opts.Servers {
		hd := http.Header{}
		if s.APIKeyEnv != "" {
			if v := getenv(s.APIKeyEnv); v != "" {
				hd.Set("Authorization", "Bearer "+v)
			}
		}
		for name, env := range s.HeadersEnv {
			if v := getenv(env); v != "" {
				hd.Set(name, v)
			}
		}
		h.servers[s.Name] = &server{cfg: s, headers: hd}
	}
	h.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_mcp_tool_calls_total",
		Help: "MCP tools/call requests by server, tool (a configured name, or \"other\") and outcome (allowed, limited, error).",
	}, []string{"server", "tool", "outcome"})
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(h.calls); err != nil {
			return nil, fmt.Errorf("mcpgate: register metrics: %w", err)
		}
	}
	return h, nil
}

// JSON-RPC error codes of the ingress's own answers. -32029 is in the
// range JSON-RPC 2.0 reserves for implementation-defined server errors
// (-32000 to -32099); its data says what to do.
const (
	codeRateLimited  = -32029
	codeUnavailable  = -32003
	codeInvalid      = -32602 // JSON-RPC's "Invalid params"
	codeParse        = -32700
	codeUnauthorized = -32001
)

// sessionSep separates the client's id from the server's session id in the
// Mcp-Session-Id the client sees: a session is bound to the key that
// opened it, so another key cannot read or drive it, on any replica.
const sessionSep = "~"

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/mcp/")
	srv := h.servers[name]
	if srv == nil {
		writeRPCError(w, http.StatusNotFound, nil, codeInvalid, fmt.Sprintf("no MCP server %q is configured at this gateway", truncate(name)), nil)
		return
	}
	cl, ok := h.auth(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
		writeRPCError(w, http.StatusUnauthorized, nil, codeUnauthorized, "a valid gateway key is required (Authorization: Bearer <key>)", nil)
		return
	}
	id := cl.ID()
	sid := ""
	if v := r.Header.Get("Mcp-Session-Id"); v != "" {
		owner, upstreamID, found := strings.Cut(v, sessionSep)
		if !found || owner != id || upstreamID == "" {
			// As the transport says of an unknown session: 404, and the
			// client starts a new one.
			writeRPCError(w, http.StatusNotFound, nil, codeInvalid, "session not found", nil)
			return
		}
		sid = upstreamID
	}
	switch r.Method {
	case http.MethodPost:
		h.post(w, r, srv, cl, sid)
	case http.MethodGet, http.MethodDelete:
		h.forward(w, r, srv, id, sid, nil, nil)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		writeRPCError(w, http.StatusMethodNotAllowed, nil, codeInvalid, "method not allowed", nil)
	}
}

// message is what the ingress reads of a JSON-RPC message.
type message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Name string `json:"name"`
	} `json:"params"`
}

// call is one tools/call of a POST.
type call struct {
	id    json.RawMessage
	tool  string // as sent
	label string // a configured name or "other"
	key   string // the limits' name: a configured tool or "*"
	lim   ToolLimits
}

func (h *Handler) post(w http.ResponseWriter, r *http.Request, srv *server, cl Client, sid string) {
	client := cl.ID()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeRPCError(w, http.StatusRequestEntityTooLarge, nil, codeInvalid, fmt.Sprintf("request body over %d bytes", h.maxBody), nil)
			return
		}
		writeRPCError(w, http.StatusBadRequest, nil, codeParse, "reading the body: "+err.Error(), nil)
		return
	}
	msgs, batch, err := decode(body)
	if err != nil {
		writeRPCError(w, http.StatusBadRequest, nil, codeParse, err.Error(), nil)
		return
	}
	var calls []call
	for _, m := range msgs {
		if m.Method != "tools/call" || len(m.ID) == 0 {
			continue
		}
		if !toolRE.MatchString(m.Params.Name) {
			h.calls.WithLabelValues(srv.cfg.Name, "other", "error").Inc()
			writeRPCError(w, http.StatusOK, m.ID, codeInvalid, "tools/call: params.name is not a tool name (1 to 128 of A-Z a-z 0-9 _ - . /)", nil)
			return
		}
		c := call{id: m.ID, tool: m.Params.Name, label: "other"}
		if l, ok := srv.cfg.Tools[c.tool]; ok {
			c.key, c.label, c.lim = c.tool, c.tool, l
		} else if l, ok := srv.cfg.Tools["*"]; ok {
			c.key, c.lim = "*", l
		}
		calls = append(calls, c)
	}
	reqs, names := h.requests(srv, cl.Prefix(), calls)
	own := len(reqs) // the tool limits' requests; the client's charges follow
	if len(calls) > 0 {
		var cost int64
		for _, c := range calls {
			cost += c.lim.cost()
		}
		more, err := cl.Charges(r, len(calls), cost)
		if err != nil {
			writeRPCError(w, http.StatusOK, calls[0].id, codeInvalid, err.Error(), nil)
			return
		}
		reqs = append(reqs, more...)
	}
	if len(reqs) > 0 {
		ds, err := h.store.ApplyAll(r.Context(), sluice.OpAllow, reqs)
		if err != nil {
			h.log.Warn("mcp: limits unavailable", "server", srv.cfg.Name, "client", client, "err", err)
			for _, c := range calls {
				h.calls.WithLabelValues(srv.cfg.Name, c.label, "error").Inc()
			}
			h.deny(w, msgs, batch, calls, codeUnavailable, "the gateway's rate limiter is unavailable; retry later", time.Second, "unavailable")
			return
		}
		if wait, denied := retryAfter(ds); denied {
			for _, c := range calls {
				h.calls.WithLabelValues(srv.cfg.Name, c.label, "limited").Inc()
			}
			cl.Decided(deniedBy(names, ds, own), wait)
			h.deny(w, msgs, batch, calls, codeRateLimited, "rate limit exceeded for this tool; retry after retry_after seconds", wait, "rate_limited")
			return
		}
	}
	for _, c := range calls {
		h.calls.WithLabelValues(srv.cfg.Name, c.label, "allowed").Inc()
	}
	if len(calls) > 0 {
		cl.Decided("", 0)
	}
	var leases []sluice.Request
	for _, q := range reqs {
		if q.Algorithm == sluice.Concurrency {
			leases = append(leases, q)
		}
	}
	h.forward(w, r, srv, client, sid, body, leases)
}

// requests builds the store requests of the calls: one per limit, on keys
// under the client's prefix (its hash tag: one Redis Cluster slot, one
// atomic batch with its budgets).
// A concurrency slot is leased to a fresh id, released when the answer is
// relayed (or lapses after LeaseTTL).
//
// names[i] names reqs[i] for the console: "mcp:SERVER/TOOL:rpm", TOOL a
// configured name or "other" (bounded by the config).
func (h *Handler) requests(srv *server, clientPrefix string, calls []call) (reqs []sluice.Request, names []string) {
	prefix := clientPrefix + "mcp:" + srv.cfg.Name + ":"
	for _, c := range calls {
		if c.key == "" {
			continue
		}
		k := prefix + c.key + ":"
		name := "mcp:" + srv.cfg.Name + "/" + c.label + ":"
		if c.lim.RPM > 0 {
			names = append(names, name+"rpm")
			reqs = append(reqs, sluice.Request{Key: k + "rpm", Algorithm: sluice.GCRA, Limit: sluice.PerMinute(c.lim.RPM), Cost: 1})
		}
		if c.lim.RPD > 0 {
			names = append(names, name+"rpd")
			reqs = append(reqs, sluice.Request{Key: k + "rpd", Algorithm: sluice.GCRA, Limit: sluice.PerDay(c.lim.RPD), Cost: 1})
		}
		if c.lim.Concurrency > 0 {
			names = append(names, name+"concurrency")
			reqs = append(reqs, sluice.Request{Key: k + "concurrency", Algorithm: sluice.Concurrency,
				Limit: sluice.Limit{Rate: c.lim.Concurrency, Period: h.leaseTTL}, Cost: 1, Lease: newID()})
		}
	}
	return reqs, names
}

// deniedBy names the limit of the first denied decision: a tool limit by
// its name, else the client's budgets ("mcp_budget").
func deniedBy(names []string, ds []sluice.Decision, own int) string {
	for i, d := range ds {
		if d.Allowed {
			continue
		}
		if i < own {
			return names[i]
		}
		return "mcp_budget"
	}
	return "mcp"
}

// retryAfter is the longest wait of the denied decisions.
func retryAfter(ds []sluice.Decision) (time.Duration, bool) {
	var wait time.Duration
	denied := false
	for _, d := range ds {
		if !d.Allowed {
			denied = true
			wait = max(wait, d.RetryAfter)
		}
	}
	if denied && wait <= 0 {
		wait = time.Second // a concurrency slot: no time is known
	}
	return wait, denied
}

// deny answers a POST none of whose calls went to the server: each request
// of it gets a JSON-RPC error (a batch is all or nothing, as the store
// decided it), with HTTP 200 so that the client's session goes on.
func (h *Handler) deny(w http.ResponseWriter, msgs []message, batch bool, calls []call, code int, msg string, wait time.Duration, typ string) {
	secs := math.Ceil(wait.Seconds()*1000) / 1000
	limited := map[string]call{}
	for _, c := range calls {
		limited[string(c.id)] = c
	}
	var out []json.RawMessage
	for _, m := range msgs {
		if len(m.ID) == 0 {
			continue // a notification gets no answer
		}
		data := map[string]any{"type": typ, "retry_after": secs, "retry_after_ms": wait.Milliseconds()}
		text := msg
		if c, ok := limited[string(m.ID)]; ok {
			data["tool"] = c.tool
		} else {
			text = "not sent: another call of this batch was refused"
		}
		out = append(out, rpcError(m.ID, code, text, data))
	}
	w.Header().Set("Retry-After", fmt.Sprint(int64(math.Ceil(wait.Seconds()))))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if !batch && len(out) == 1 {
		_, _ = w.Write(out[0])
		return
	}
	b, _ := json.Marshal(out)
	_, _ = w.Write(b)
}

// forward sends the request to the server with the gateway's credentials
// and relays the answer as it arrives (an event stream flushed event by
// event); leases are released when the answer is over.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, srv *server, client, sid string, body []byte, leases []sluice.Request) {
	defer h.release(r.Context(), leases)
	if !h.enter(client) {
		// Unmetered requests (GET streams, tools/list, ...) hold a
		// connection to the server each: one key may not hold them all.
		w.Header().Set("Retry-After", "1")
		writeRPCError(w, http.StatusTooManyRequests, nil, codeRateLimited,
			fmt.Sprintf("more than %d requests of this key are at the MCP servers; retry when one ends", h.maxInFlight),
			map[string]any{"type": "rate_limited", "retry_after": 1, "retry_after_ms": 1000})
		return
	}
	defer h.leave(client)
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, srv.cfg.URL, rd)
	if err != nil {
		writeRPCError(w, http.StatusBadGateway, nil, codeUnavailable, "building the server request failed", nil)
		return
	}
	for _, k := range []string{"Accept", "Content-Type", "Mcp-Protocol-Version", "Last-Event-Id"} {
		if v := r.Header.Values(k); len(v) > 0 {
			req.Header[k] = v
		}
	}
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	for k, v := range srv.headers {
		req.Header[k] = v
	}
	resp, err := h.client.Do(req)
	if err != nil {
		if r.Context().Err() == nil {
			h.log.Warn("mcp: server unreachable", "server", srv.cfg.Name, "err", err)
		}
		writeRPCError(w, http.StatusBadGateway, nil, codeUnavailable, fmt.Sprintf("MCP server %q is unreachable", srv.cfg.Name), nil)
		return
	}
	defer resp.Body.Close()
	for _, k := range []string{"Content-Type", "Cache-Control", "Mcp-Protocol-Version", "Www-Authenticate"} {
		if v := resp.Header.Values(k); len(v) > 0 {
			w.Header()[k] = v
		}
	}
	if v := resp.Header.Get("Mcp-Session-Id"); v != "" {
		w.Header().Set("Mcp-Session-Id", client+sessionSep+v)
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	// The headers go at once: a GET stream may carry no event for a long
	// time, and its client waits for them to know the stream is open.
	_ = rc.Flush()
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// enter counts a request of client at the servers, or reports false when
// it has maxInFlight there already. The map holds only clients with
// requests in flight, and clients are the config's keys.
func (h *Handler) enter(client string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inFlight[client] >= h.maxInFlight {
		return false
	}
	h.inFlight[client]++
	return true
}

func (h *Handler) leave(client string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inFlight[client]--; h.inFlight[client] <= 0 {
		delete(h.inFlight, client)
	}
}

// release gives back the calls' concurrency slots, even when the client is
// gone (its context is then done).
func (h *Handler) release(ctx context.Context, leases []sluice.Request) {
	if len(leases) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := h.store.ApplyAll(ctx, sluice.OpRefund, leases); err != nil {
		h.log.Warn("mcp: releasing concurrency slots failed; they lapse after the lease TTL", "err", err)
	}
}

// decode reads one JSON-RPC message or a batch of at most MaxBatch.
func decode(body []byte) ([]message, bool, error) {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		var msgs []message
		if err := json.Unmarshal(body, &msgs); err != nil {
			return nil, true, fmt.Errorf("not a JSON-RPC batch: %w", err)
		}
		if len(msgs) == 0 || len(msgs) > MaxBatch {
			return nil, true, fmt.Errorf("a batch holds 1 to %d messages, not %d", MaxBatch, len(msgs))
		}
		return msgs, true, nil
	}
	var m message
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, false, fmt.Errorf("not a JSON-RPC message: %w", err)
	}
	return []message{m}, false, nil
}

func rpcError(id json.RawMessage, code int, msg string, data any) json.RawMessage {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	e := map[string]any{"code": code, "message": msg}
	if data != nil {
		e["data"] = data
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": e})
	return b
}

func writeRPCError(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string, data any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(rpcError(id, code, msg, data))
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
