package server

import (
	"net/http"
	"time"
)

// This file serves the console's view of the AI gateway's upstream pool
// (GET /ui/api/upstreams, admin token): per upstream and model, the
// provider limits declared and in force (tightened by what the provider
// reported), what the shared store has left of each, what the provider
// last reported left, and whether it is cooling or down. It is the
// gateway's own GET /v1/status upstreams, served where the gateway runs
// inside `sluice serve`. It names upstreams and model ids from the
// config, never a key.

// upstreamsReuse is how long one read of the pool's headroom serves the
// console's callers: a read peeks every upstream model, a store call each.
const upstreamsReuse = time.Second

// SetGatewayUpstreams gives the console the gateway's upstream headroom;
// `sluice serve` calls it (through Deps) when its config runs the gateway.
func (s *Server) SetGatewayUpstreams(f SpendFunc) { s.upstreams.set(f, upstreamsReuse) }

func (s *Server) handleUpstreams(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authorizeConsole(w, r, "upstreams"); !ok {
		return
	}
	s.upstreams.serve(s, w, r, "upstreams")
}
