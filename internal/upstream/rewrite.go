package upstream

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
)

// DefaultAnthropicVersion is sent to an Anthropic upstream when the client
// sent no anthropic-version.
const DefaultAnthropicVersion = "2023-06-01"

// credentialHeaders are the headers a request never carries to an
// upstream but the upstream's own.
var credentialHeaders = []string{"Authorization", "Api-Key", "X-Api-Key"}

// Rewrite points out, a request the gateway received at inPath (such as
// "/v1/chat/completions"), at t: its URL (Azure: the deployment's path and
// api-version), its credentials (the upstream's only) and, when body is not
// nil, the body with the upstream's model id.
func (t *TargetState) Rewrite(out *http.Request, inPath string, body []byte, clientModel string) []byte {
	u := t.Up
	t.Up.Point(out, inPath)
	if u.Kind == Azure {
		out.URL.Path = u.basePath + "/openai/deployments/" + url.PathEscape(t.Model) + strings.TrimPrefix(inPath, "/v1")
	}
	if body != nil && t.Model != clientModel && u.Kind != Azure {
		if nb, ok := WithModel(body, t.Model); ok {
			body = nb
		}
	}
	return body
}

// Point points out at u for a request received at inPath, with u's
// credentials only: the route-free rewrite of passthrough requests.
func (u *Upstream) Point(out *http.Request, inPath string) {
	out.URL.Scheme = u.base.Scheme
	out.URL.Host = u.base.Host
	out.URL.Path = u.basePath + strings.TrimPrefix(inPath, "/v1")
	out.URL.RawPath = ""
	out.Host = u.base.Host
	if u.Kind == Azure {
		out.URL.Path = u.basePath + "/openai" + strings.TrimPrefix(inPath, "/v1")
		q := out.URL.Query()
		q.Set("api-version", u.apiVersion)
		out.URL.RawQuery = q.Encode()
	}
	for _, h := range credentialHeaders {
		delete(out.Header, h)
	}
	if u.auth.name != "" {
		out.Header[u.auth.name] = u.auth.value
	}
	if u.Kind == Anthropic && out.Header.Get("Anthropic-Version") == "" {
		out.Header["Anthropic-Version"] = []string{DefaultAnthropicVersion}
	}
}

// WithModel returns body, a JSON object, with its top-level "model" member
// set to model, and whether it had one. The rest of the body is kept byte
// for byte.
func WithModel(body []byte, model string) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return body, false
	}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return body, false
		}
		after := int(dec.InputOffset())
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return body, false
		}
		if key, _ := kt.(string); key != "model" {
			continue
		}
		end := int(dec.InputOffset())
		start := after
		for start < end && (body[start] == ':' || body[start] == ' ' || body[start] == '\t' || body[start] == '\n' || body[start] == '\r') {
			start++
		}
		quoted, err := json.Marshal(model)
		if err != nil {
			return body, false
		}
		out := make([]byte, 0, len(body)-(end-start)+len(quoted))
		out = append(append(append(out, body[:start]...), quoted...), body[end:]...)
		return out, true
	}
	return body, false
}
