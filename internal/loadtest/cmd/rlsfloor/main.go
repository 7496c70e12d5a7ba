// Command rlsfloor serves Envoy's RateLimitService with a handler that
// decides nothing (loadtest.EmptyRLS): every call is answered OVERALL OK
// with one OK status per descriptor, and no store is asked. It runs on the
// very gRPC server that `sluice serve` builds (envoyrls.NewGRPCServerFor:
// same options, codec, health and reflection) on a plain TCP listener
// (sluice's own accepts through the peers' budgets, which are sluice's
// work), so its CPU per request is the gRPC floor that
// internal/loadtest/bench-envoy-cold.sh measures sluice against. Its heap
// is ~1 MB, so Go's collector runs at its 4 MB minimum goal, far more
// often per request than in `sluice serve`: the script also runs it with
// GOGC=400, a floor without that toll. It is a benchmark tool: nothing
// imports it, and only the scripts build it.
//
//	rlsfloor -addr 127.0.0.1:18081
//	GOGC=400 rlsfloor -addr 127.0.0.1:18082
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-io/sluice/internal/envoyrls"
	"github.com/sluice-io/sluice/internal/loadtest"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "gRPC listen address")
	flag.Parse()
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlsfloor:", err)
		os.Exit(1)
	}
	g := envoyrls.NewGRPCServerFor(loadtest.EmptyRLS{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); g.Stop() }()
	if err := g.Serve(lis); err != nil {
		fmt.Fprintln(os.Stderr, "rlsfloor:", err)
		os.Exit(1)
	}
}
