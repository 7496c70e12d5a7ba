package server

import (
	"fmt"
	"strings"
	"testing"
)

// unknownKeysDefaultTier edits a bypass config to give unknown API keys
// the default tier (each its own limit), as behind an upstream that checks
// keys.
func unknownKeysDefaultTier(cfg string) string {
	return strings.Replace(cfg, "authz:\n", "authz:\n  unknown_keys: default_tier\n", 1)
}

// bypass2Tricks are the tricks of a second round, run as TestBypass runs
// its own.
var bypass2Tricks = []bypassTrick{
	// The upstream checks the key in Authorization; sluice reads
	// X-API-Key first. A fresh invented key there each time would be a
	// fresh default-tier limit each time.
	{name: "authz/fresh unknown key beside the checked one", config: unknownKeysDefaultTier, limit: 3, want: 0, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", fmt.Sprintf("sk-invented-%d", i), "Authorization", "Bearer "+bypassFree)
	}},
	// A known key beside another credential (a JWT for the upstream) is
	// charged as that key.
	{name: "authz/known key beside a bearer token", config: unknownKeysDefaultTier, limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", bypassFree, "Authorization", fmt.Sprintf("Bearer eyJ.%d.sig", i))
	}},
	// A backend that compares paths case-insensitively by upper case
	// (ASP.NET Core's routing) serves /logın (dotless i) and /ſ (long s)
	// as /login and /s.
	{name: "authz/route not dodged by letters whose upper case is ASCII", limit: 2, want: 2, n: 8, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", bypassEnt, "X-Forwarded-Uri", rotate([]string{
			"/logın", "/LOGıN/x", "/log%C4%B1n", "/log%c4%b1n?x", "/x/../logın",
		}, i))
	}},
}

// TestBypass2 runs bypass2Tricks on the memory store and a real Redis.
func TestBypass2(t *testing.T) { runBypass(t, bypass2Tricks) }
