package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/grpclog"

	"github.com/sluice-io/sluice/internal/envoyrls"
	"github.com/sluice-io/sluice/internal/server"
	"github.com/sluice-io/sluice/internal/tracing"
)

// serveFlags are the settings of `sluice serve`. Each flag also reads an
// environment variable, named in its help; a flag given on the command line
// wins.
type serveFlags struct {
	config    string
	listen    string
	logFormat string
	logLevel  string
}

func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the rate-limit service: HTTP API, forward-auth, metrics, hot reload",
		Long: `Run the rate-limit service with the policies, tiers and keys of a YAML config.

The service answers POST /v1/check, GET /v1/status, POST /v1/reset (admin),
/v1/authz (forward-auth for NGINX, Traefik, Caddy, Envoy), /healthz, /readyz
and /metrics. The config file is reloaded when it changes and on SIGHUP; an
invalid new version is rejected and the running one keeps serving. SIGINT or
SIGTERM drain in-flight requests and stop.

Environment: SLUICE_CONFIG, SLUICE_LISTEN, SLUICE_LOG_FORMAT, SLUICE_LOG_LEVEL,
SLUICE_ADMIN_TOKEN (an admin token, named so in audit lines), and the Redis
store's SLUICE_REDIS_USERNAME and SLUICE_REDIS_PASSWORD.`,
		Example: "  sluice serve --config examples/sluice.yaml\n  SLUICE_ADMIN_TOKEN=$(openssl rand -hex 32) sluice serve --config /etc/sluice/sluice.yaml --listen :9090 --log-format json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd.ErrOrStderr(), f.logFormat, f.logLevel)
			if err != nil {
				return err
			}
			routeGRPCLogs(log)
			if lim := debug.SetMemoryLimit(-1); lim < math.MaxInt64 {
				log.Info("go memory limit", "bytes", lim)
			}
			tr, err := tracing.FromEnv(cmd.Context(), version)
			if err != nil {
				return err
			}
			defer func() { _ = tr.Shutdown(context.WithoutCancel(cmd.Context())) }()
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			return server.Run(cmd.Context(), server.ServiceOptions{
				ConfigPath: f.config,
				Listen:     f.listen,
				AdminToken: os.Getenv("SLUICE_ADMIN_TOKEN"),
				Logger:     log,
				Signals:    hup,
				Tracing:    tr, // nil (off) unless OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT is set
				// Seam: components that run beside the API, started and
				// drained together with it. The Envoy rate limit service
				// (internal/envoyrls) and the AI gateway (internal/gateway)
				// go here, each a server.ComponentFunc that reads its own
				// config section (config.File) and returns nil when absent.
				Components: []server.ComponentFunc{envoyComponent, gatewayComponent},
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.config, "config", "c", cmp.Or(os.Getenv("SLUICE_CONFIG"), "sluice.yaml"), "config file (env SLUICE_CONFIG)")
	fl.StringVar(&f.listen, "listen", os.Getenv("SLUICE_LISTEN"), "HTTP listen address, overriding the config's (env SLUICE_LISTEN)")
	fl.StringVar(&f.logFormat, "log-format", cmp.Or(os.Getenv("SLUICE_LOG_FORMAT"), "text"), "log format: text or json (env SLUICE_LOG_FORMAT)")
	fl.StringVar(&f.logLevel, "log-level", cmp.Or(os.Getenv("SLUICE_LOG_LEVEL"), "info"), "log level: debug, info, warn or error (env SLUICE_LOG_LEVEL)")
	return cmd
}

// newLogger returns a slog logger writing text or JSON to w.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("serve: --log-level %q: valid: debug, info, warn, error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationString}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("serve: --log-format %q: valid: text, json", format)
}

// durationString writes durations as Go duration strings ("1.5s"), as the
// text handler does, instead of the JSON handler's integer nanoseconds.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// grpcLog is the logger that grpc-go's process-wide logger writes to: the
// one of the running `sluice serve`. grpc-go allows its logger to be set
// once, before any gRPC use, so it is installed once and pointed at each
// run's logger.
var (
	grpcLog     atomic.Pointer[slog.Logger]
	grpcLogOnce sync.Once
)

// routeGRPCLogs sends grpc-go's log lines through log, in its format and
// at its level, like every other line of the service.
func routeGRPCLogs(log *slog.Logger) {
	grpcLog.Store(log)
	grpcLogOnce.Do(func() { grpclog.SetLoggerV2(envoyrls.GRPCLogger(grpcLog.Load)) })
}
