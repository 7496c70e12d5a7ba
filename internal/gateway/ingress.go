package gateway

// The ingress stage: which paths the gateway meters, serves, passes
// through or answers 404 (ServeHTTP in gateway.go runs the stages).

import (
	"net/http"
	"path"
	"slices"
	"strings"
)

// endpoint is a path whose requests are limited.
type endpoint uint8

const (
	epNone endpoint = iota
	epChat
	epCompletions
	epEmbeddings
	epResponses
)

var endpoints = map[string]endpoint{
	"/v1/chat/completions": epChat,
	"/v1/completions":      epCompletions,
	"/v1/embeddings":       epEmbeddings,
	"/v1/responses":        epResponses,
	// Anthropic's Messages API (anthropic.go).
	"/v1/messages":              epMessages,
	"/v1/messages/count_tokens": epCountTokens,
}

// routedPaths lists the paths the server's mux routes by name: the metered
// endpoints, the status and the model list.
func routedPaths() []string {
	ps := []string{statusPath, modelsPath}
	for p := range endpoints {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// served reports whether the gateway serves r's method and path (for an
// authenticated client): a metered POST (or a case variant of POST, which
// gets 405 after authentication), GET of the status, a read of the model
// list, or a path under a passthrough prefix.
func (g *Gateway) served(r *http.Request) bool {
	if g.batches != nil && isBatchPath(r.URL.Path) {
		return true
	}
	if endpoints[r.URL.Path] != epNone && strings.EqualFold(r.Method, http.MethodPost) {
		return true
	}
	if r.URL.Path == statusPath && r.Method == http.MethodGet {
		return true
	}
	if (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Upgrade") == "" && underPrefix(canonicalPath(r.URL.Path), modelsPath) {
		return true
	}
	return g.passesThrough(r.URL.Path)
}

// unknownURL answers 404 for a method and path the gateway does not serve,
// naming the metered paths, or the metered path that r's path spells
// another way.
func unknownURL(w http.ResponseWriter, r *http.Request) {
	if strings.EqualFold(r.Method, http.MethodPost) {
		if alias := meteredAlias(r.URL.Path); alias != "" {
			writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "",
				"Unknown request URL: "+r.Method+" "+r.URL.Path+". Did you mean "+alias+"?")
			return
		}
	}
	writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "",
		"Unknown request URL: "+r.Method+" "+r.URL.Path+". The sluice gateway meters "+meteredList+" and passes GET "+modelsPath+" through; other paths pass only when its passthrough setting lists them (their answers are shared by every client of the gateway's upstream key).")
}

// meteredAlias returns the metered path that p is another spelling of
// (canonicalPath), or "".
func meteredAlias(p string) string {
	canon := canonicalPath(p)
	if _, ok := endpoints[canon]; ok && canon != p {
		return canon
	}
	return ""
}

// meteredList names the metered paths for error messages.
const meteredList = "POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/messages and /v1/messages/count_tokens"

// passesThrough reports whether p, canonically, is under one of the
// configured passthrough prefixes.
func (g *Gateway) passesThrough(p string) bool {
	if len(g.cfg.Passthrough) == 0 {
		return false
	}
	canon := canonicalPath(p)
	for _, pre := range g.cfg.Passthrough {
		if underPrefix(canon, pre) {
			return true
		}
	}
	return false
}

// modelsPath is the one path whose reads pass through without a
// passthrough setting: the model list, the same for every client.
const modelsPath = "/v1/models"

// underPrefix reports whether the canonical path canon is pre or under it,
// on a segment boundary.
func underPrefix(canon, pre string) bool {
	return canon == pre || strings.HasPrefix(canon, pre+"/")
}

// metersUnder reports whether prefix is a metered path or holds one.
func metersUnder(prefix string) bool {
	for m := range endpoints {
		if m == prefix || strings.HasPrefix(m, prefix+"/") {
			return true
		}
	}
	return false
}

// canonicalPath is the path a lenient upstream or proxy may route p to:
// lower case, without ;parameters, dot segments, repeated slashes and
// trailing slashes or dots. gateway.Server's mux redirects the unclean
// spellings itself; a Gateway mounted on another router sees them.
func canonicalPath(p string) string {
	canon, _, _ := strings.Cut(strings.ToLower(p), ";")
	return strings.TrimRight(path.Clean(canon), "/.")
}
