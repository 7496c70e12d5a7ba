// Package mcpgate is the gateway's MCP ingress: it proxies the Model
// Context Protocol's Streamable HTTP transport (JSON-RPC 2.0 over POST,
// answers as JSON or as a server-sent event stream, the GET stream and the
// DELETE that ends a session) to configured MCP servers, and meters every
// tools/call per client key × server × tool in the shared store: requests
// per minute and per day, and calls in flight.
//
// A denied call is answered, like any JSON-RPC error, with HTTP 200 and an
// error object whose data carries retry_after, so that an agent's MCP
// session survives its own denial and the agent can wait and retry; an
// HTTP error would end the session in the SDKs. Clients authenticate with
// their gateway key; the server gets the gateway's own credentials, never
// the client's key.
package mcpgate

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"time"

	"github.com/sluice-io/sluice/internal/pricing"
)

// ErrInvalidConfig means an mcp_servers section is malformed.
var ErrInvalidConfig = errors.New("mcpgate: invalid configuration")

// Bounds of what a configuration and a caller may hold.
const (
	// MaxServers bounds the mcp_servers entries.
	MaxServers = 64
	// MaxTools bounds the tools named under one server.
	MaxTools = 256
	// DefaultMaxBodyBytes bounds a POST body when MaxBodyBytes is zero.
	DefaultMaxBodyBytes = 1 << 20
	// MaxBatch bounds the messages of one JSON-RPC batch.
	MaxBatch = 64
	// DefaultMaxInFlightPerKey bounds one client key's requests at the
	// MCP servers at once on one gateway, metered or not (a GET stream
	// holds one for the session's life), when Options.MaxInFlightPerKey
	// is zero; past it the gateway answers 429. An agent fleet on one key
	// sends hundreds of tool calls at once.
	DefaultMaxInFlightPerKey = 256
	// DefaultLeaseTTL is how long a concurrency slot lives when the
	// gateway that holds it dies before releasing it.
	DefaultLeaseTTL = 10 * time.Minute
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// toolRE is what MCP allows in a tool name (specification 2025-11-25,
// "Tool names": 1 to 128 characters of ASCII letters, digits, '_', '-',
// '.' and '/').
var toolRE = regexp.MustCompile(`^[A-Za-z0-9_./-]{1,128}$`)

// ServerConfig is one entry of `mcp_servers:`.
type ServerConfig struct {
	// Name is the server's name in the gateway's path, /mcp/<name>.
	Name string `yaml:"name"`
	// URL is the server's Streamable HTTP endpoint, such as
	// "https://mcp.example.com/mcp".
	URL string `yaml:"url"`
	// APIKeyEnv names an environment variable whose value is sent to the
	// server as "Authorization: Bearer <value>"; empty sends none.
	APIKeyEnv string `yaml:"api_key_env"`
	// HeadersEnv maps further header names to the environment variables
	// holding their values (credentials the gateway holds for the server).
	HeadersEnv map[string]string `yaml:"headers_env"`
	// Tools maps a tool name, or "*" for every tool not named, to its
	// limits per client key. A tool not named, when "*" is not set, is
	// not limited. Tools not named share the "*" limits' counters.
	Tools map[string]ToolLimits `yaml:"tools"`
}

// ToolLimits are the limits of one tool (or of "*") per client key.
type ToolLimits struct {
	// RPM and RPD are calls per minute and per day; zero means none.
	RPM int64 `yaml:"rpm"`
	RPD int64 `yaml:"rpd"`
	// Concurrency bounds the calls in flight; zero means none.
	Concurrency int64 `yaml:"concurrency"`
	// CostUSD is what one call costs in dollars, such as "0.01", charged
	// at admission against the key's, team's and org's budgets and the
	// session's (the gateway's Client.Charges); empty costs nothing.
	CostUSD string `yaml:"cost_usd"`
}

func (l ToolLimits) any() bool { return l.RPM > 0 || l.RPD > 0 || l.Concurrency > 0 || l.CostUSD != "" }

// cost is CostUSD in micro-dollars; Validate checked it.
func (l ToolLimits) cost() int64 {
	m, _ := pricing.ParseUSD(l.CostUSD)
	return int64(m)
}

// Validate checks the servers, their URLs and their limits.
func Validate(servers []ServerConfig) error {
	if len(servers) > MaxServers {
		return fmt.Errorf("%w: mcp_servers: %d entries, at most %d", ErrInvalidConfig, len(servers), MaxServers)
	}
	seen := map[string]bool{}
	for i, s := range servers {
		where := fmt.Sprintf("mcp_servers[%d]", i)
		if !nameRE.MatchString(s.Name) {
			return fmt.Errorf("%w: %s.name %q: 1 to 64 letters, digits, '_', '.' or '-'", ErrInvalidConfig, where, s.Name)
		}
		if seen[s.Name] {
			return fmt.Errorf("%w: %s.name %q: named twice", ErrInvalidConfig, where, s.Name)
		}
		seen[s.Name] = true
		u, err := url.Parse(s.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%w: %s (%s).url %q: an http or https URL of the server's MCP endpoint, such as https://mcp.example.com/mcp", ErrInvalidConfig, where, s.Name, s.URL)
		}
		if len(s.Tools) > MaxTools {
			return fmt.Errorf("%w: %s (%s).tools: %d entries, at most %d", ErrInvalidConfig, where, s.Name, len(s.Tools), MaxTools)
		}
		for tool, l := range s.Tools {
			if tool != "*" && !toolRE.MatchString(tool) {
				return fmt.Errorf("%w: %s (%s).tools: %q is not a tool name (1 to 128 of A-Z a-z 0-9 _ - . /) or \"*\"", ErrInvalidConfig, where, s.Name, tool)
			}
			if l.RPM < 0 || l.RPD < 0 || l.Concurrency < 0 {
				return fmt.Errorf("%w: %s (%s).tools.%s: limits must not be negative", ErrInvalidConfig, where, s.Name, tool)
			}
			if !l.any() {
				return fmt.Errorf("%w: %s (%s).tools.%s: sets no limit (rpm, rpd, concurrency or cost_usd)", ErrInvalidConfig, where, s.Name, tool)
			}
			if l.CostUSD != "" {
				if m, err := pricing.ParseUSD(l.CostUSD); err != nil || m < 0 {
					return fmt.Errorf("%w: %s (%s).tools.%s.cost_usd %q: a dollar amount such as 0.01", ErrInvalidConfig, where, s.Name, tool, l.CostUSD)
				}
			}
		}
		for h := range s.HeadersEnv {
			if h == "" || len(h) > 128 {
				return fmt.Errorf("%w: %s (%s).headers_env: header name %q", ErrInvalidConfig, where, s.Name, h)
			}
		}
	}
	return nil
}
