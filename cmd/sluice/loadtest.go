package main

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/internal/loadtest"
)

func newLoadtestCmd() *cobra.Command {
	var (
		o       loadtest.Options
		headers []string
		g       loadtest.GRPCOptions
	)
	cmd := &cobra.Command{
		Use:   "loadtest",
		Short: "Load the HTTP API and print throughput and latency percentiles",
		Long: `Send requests over N keep-alive connections for a duration or a count, and
print requests/s, status codes and latency p50/p90/p99/p99.9/max.

"{key}" in the body is replaced by a key number in [0, --keys), spreading
the load over that many keys. Target only services you run, on this machine.`,
		Example: `  sluice loadtest --url http://127.0.0.1:8080/v1/check -c 64 -d 10s \
    --body '{"policy":"free","key":"user-{key}"}' --keys 100000
  sluice loadtest --grpc 127.0.0.1:8081 --domain edge --descriptor 'remote_address=10.0.{key}' \
    -c 64 -d 10s --keys 100000 --pid "$(pgrep -n sluice)"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.Addr != "" {
				// --grpc: the Envoy rate limit service.
				g.Keys, g.Streams, g.Duration, g.Requests, g.Timeout = o.Keys, o.Connections, o.Duration, o.Requests, o.Timeout
				if g.Duration == 0 && g.Requests == 0 {
					g.Duration = 10 * time.Second
				}
				res, err := loadtest.RunGRPC(cmd.Context(), g)
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(cmd.OutOrStdout(), res)
				return err
			}
			o.Header = http.Header{}
			for _, h := range headers {
				name, value, ok := strings.Cut(h, ":")
				if !ok {
					return fmt.Errorf("loadtest: header %q: want Name: value", h)
				}
				o.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
			}
			if o.Duration == 0 && o.Requests == 0 {
				o.Duration = 10 * time.Second
			}
			res, err := loadtest.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), res)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.URL, "url", "http://127.0.0.1:8080/v1/check", "endpoint")
	fl.StringVarP(&o.Method, "method", "X", "", "HTTP method (default POST with a body, else GET)")
	fl.StringVar(&o.Body, "body", `{"policy":"free","key":"user-{key}"}`, "request body; {key} becomes a key number")
	fl.StringArrayVarP(&headers, "header", "H", nil, "extra header, Name: value (repeatable)")
	fl.IntVar(&o.Keys, "keys", 10000, "distinct keys for {key}")
	fl.IntVarP(&o.Connections, "connections", "c", 64, "concurrent connections")
	fl.DurationVarP(&o.Duration, "duration", "d", 0, "run time (default 10s unless --requests)")
	fl.Int64VarP(&o.Requests, "requests", "n", 0, "total requests")
	fl.DurationVar(&o.Timeout, "timeout", 5*time.Second, "per-request timeout")
	fl.BoolVar(&o.NetHTTP, "net-http", false, "use net/http's client instead of the lean HTTP/1.1 client")
	fl.StringVar(&g.Addr, "grpc", "", "load an Envoy rate limit service (gRPC ShouldRateLimit) at HOST:PORT instead; -c is then the streams in flight")
	fl.StringVar(&g.Domain, "domain", "edge", "with --grpc: the rate-limit domain")
	fl.StringArrayVar(&g.Descriptors, "descriptor", []string{"remote_address=10.0.{key}"}, "with --grpc: a descriptor key=value, {key} a key number (repeatable)")
	fl.IntVar(&g.Connections, "grpc-connections", 4, "with --grpc: HTTP/2 connections the streams share")
	fl.Float64Var(&g.Rate, "grpc-rate", 0, "with --grpc: requests per second in all, spaced evenly (default: as fast as the streams go)")
	fl.IntVar(&g.PID, "pid", 0, "with --grpc: the server's process id, to report its CPU time per request from /proc")
	return cmd
}
