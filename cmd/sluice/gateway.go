package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/filewatch"
	"github.com/sluice-io/sluice/internal/gateway"
	"github.com/sluice-io/sluice/internal/hostcheck"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/server"
	"github.com/sluice-io/sluice/internal/tracing"
	"github.com/sluice-io/sluice/internal/yamlconf"
	"github.com/sluice-io/sluice/redisstore"
)

func newGatewayCmd() *cobra.Command {
	var f struct{ config, listen, metricsListen, logFormat, logLevel string }
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the AI gateway: an OpenAI-compatible proxy with per-key tiers and token limits",
		Long: `Run the AI gateway, an OpenAI-compatible reverse proxy for
/v1/chat/completions, /v1/completions, /v1/embeddings and /v1/responses
(GET /v1/models passes through; other paths only under a passthrough
prefix). Each client key (Authorization: Bearer)
maps to a tier with requests per minute and per day, tokens per minute and
concurrency limits, all checked at once; tokens are reserved before the
request and settled against the response's usage, streams included.

The upstream key is read from the environment variable that
upstream.api_key_env names (default OPENAI_API_KEY). The same gateway runs
inside 'sluice serve' when its config has a 'gateway:' section.
The config file is watched, and reloaded on SIGHUP, as serve's is: a
file that is whole and valid is applied whole, any other refused whole
(listen and store take a restart), with a log line either way.
GET /healthz is liveness. GET /v1/status shows a key its own limits, and
a pool's upstreams to the admin token in SLUICE_ADMIN_TOKEN (as
Authorization: Bearer; make one with: openssl rand -hex 32). Prometheus
metrics are served on their own
listener (--metrics-listen, 127.0.0.1:9464 by default), not on the
clients': they name tiers, teams, orgs and their spend.`,
		Example: "  OPENAI_API_KEY=sk-... sluice gateway --config examples/gateway.yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd.ErrOrStderr(), f.logFormat, f.logLevel)
			if err != nil {
				return err
			}
			cfg, err := gateway.Load(f.config)
			if err != nil {
				if data, rerr := os.ReadFile(f.config); rerr == nil && config.Detect(data) == config.KindServe {
					return fmt.Errorf("%w\n%s looks like a sluice serve config: run it with 'sluice serve --config %s' (its gateway: section runs the gateway)", err, f.config, f.config)
				}
				return err
			}
			if f.listen != "" {
				cfg.Listen = f.listen
			}
			if err := checkGatewayKey(cfg, os.Getenv, log); err != nil {
				return err
			}
			store, closer, err := gateway.OpenStore(cmd.Context(), cfg.Store, log)
			if err != nil {
				return err
			}
			defer closer.Close()
			tr, err := tracing.FromEnv(cmd.Context(), version)
			if err != nil {
				return err
			}
			defer func() { _ = tr.Shutdown(context.WithoutCancel(cmd.Context())) }()
			admin, err := gatewayAdmin(os.Getenv("SLUICE_ADMIN_TOKEN"))
			if err != nil {
				return err
			}
			first := readConfigFile(f.config)
			build := func(c *gateway.Config) (*gateway.Gateway, error) {
				if err := checkGatewayKey(c, os.Getenv, log); err != nil {
					return nil, err
				}
				return gateway.New(gateway.Options{Config: c, Store: tr.Store(store), Logger: log, WrapTransport: tr.Transport, Admin: admin})
			}
			gw, err := build(cfg)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			var mln net.Listener
			srv := &gateway.Server{Gateway: gw, Addr: cfg.Listen, Middleware: tr.Handler, OnListen: func(a net.Addr) {
				fmt.Fprintf(out, "sluice gateway listening on %s\n", a)
				if mln != nil {
					fmt.Fprintf(out, "sluice gateway metrics on %s/metrics\n", mln.Addr())
				}
			}}
			if f.metricsListen != "" {
				if mln, err = listenMetrics(f.metricsListen); err != nil {
					return err
				}
				// The metrics name tiers, teams and their spend: a page
				// rebound to 127.0.0.1 must not read them either. The
				// names and the metrics are those of the config of the
				// moment.
				metricsAddr := f.metricsListen
				hosts := func() *hostcheck.Policy {
					p := srv.Policy()
					p.Listen = append(p.Listen, metricsAddr)
					return p
				}
				all := promhttp.HandlerFor(prometheus.Gatherers{runtimeMetrics(store), srv.Gatherer()}, promhttp.HandlerOpts{})
				msrv := &http.Server{Handler: srv.GuardWith(hosts, metricsMux(all)), ReadHeaderTimeout: 5 * time.Second}
				go func() { _ = msrv.Serve(mln) }()
				defer msrv.Close()
			}
			// The file is watched as serve's is, and SIGHUP reloads it.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			rl := &gatewayReloader{path: f.config, listen: f.listen, srv: srv, running: cfg, build: build, log: log}
			fw := &filewatch.Watcher{Path: f.config, MaxBytes: yamlconf.MaxFileBytes, Signals: hup, Last: first, Apply: rl.apply, Reject: rl.reject, Logger: log}
			if err := fw.Watch(); err != nil {
				return fmt.Errorf("gateway: %w", err)
			}
			go func() { _ = fw.Run(cmd.Context()) }()
			return srv.Run(cmd.Context())
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.config, "config", "c", cmp.Or(os.Getenv("SLUICE_GATEWAY_CONFIG"), "gateway.yaml"), "gateway config file (env SLUICE_GATEWAY_CONFIG)")
	fl.StringVar(&f.listen, "listen", "", "listen address, overriding the config's")
	fl.StringVar(&f.metricsListen, "metrics-listen", cmp.Or(os.Getenv("SLUICE_GATEWAY_METRICS_LISTEN"), "127.0.0.1:9464"),
		"address of GET /metrics, apart from the clients' listener; empty for none (env SLUICE_GATEWAY_METRICS_LISTEN)")
	fl.StringVar(&f.logFormat, "log-format", cmp.Or(os.Getenv("SLUICE_LOG_FORMAT"), "text"), "log format: text or json (env SLUICE_LOG_FORMAT)")
	fl.StringVar(&f.logLevel, "log-level", cmp.Or(os.Getenv("SLUICE_LOG_LEVEL"), "info"), "log level: debug, info, warn or error (env SLUICE_LOG_LEVEL)")
	return cmd
}

// gatewayAdmin is a standalone gateway's admin check: whether a request
// carries token (SLUICE_ADMIN_TOKEN) as Authorization: Bearer, compared
// as SHA-256 digests in constant time; GET /v1/status with it shows the
// pool's upstreams. Without a token none is admin. A token too easy to
// guess is refused (there is no backoff of wrong tokens here, so only a
// strong one is safe).
func gatewayAdmin(token string) (func(*http.Request) bool, error) {
	if token == "" {
		return nil, nil
	}
	if weak := config.WeakToken(token); weak != "" {
		return nil, fmt.Errorf("gateway: SLUICE_ADMIN_TOKEN is too weak (%s): make one with: %s", weak, config.MakeAdminToken)
	}
	want := sha256.Sum256([]byte(token))
	return func(r *http.Request) bool {
		scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return false
		}
		sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
		return subtle.ConstantTimeCompare(sum[:], want[:]) == 1
	}, nil
}

// listenMetrics listens on addr for the gateway's metrics. A port in use
// (most often another replica on the same host, on the default
// 127.0.0.1:9464) is an error naming the setting and what to set.
func listenMetrics(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("gateway: metrics listener %s is in use (another gateway replica on this host?): give each replica its own --metrics-listen (env SLUICE_GATEWAY_METRICS_LISTEN), such as 127.0.0.1:9465, or set it empty for none: %w", addr, err)
	}
	return nil, fmt.Errorf("gateway: metrics listener %s (--metrics-listen, env SLUICE_GATEWAY_METRICS_LISTEN): %w", addr, err)
}

// metricsMux serves h at GET /metrics, and nothing else.
// runtimeMetrics are what the standalone gateway's /metrics serves beside
// the gateway's own, as `sluice serve` does: the Go runtime's and the
// process's collectors (go_*, process_*), and the counters of store, the
// store it opened (sluice_lease_*, sluice_redis_*, sluice_store_calls_total
// and sluice_store_errors_total of the Redis store).
func runtimeMetrics(store sluice.Store) prometheus.Gatherer {
	reg := metrics.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		metrics.NewStoreCollector(func() metrics.StoreStats {
			var out metrics.StoreStats
			server.AddStoreStats(&out, store)
			// No guard counts the calls here: the Redis store's own.
			for s := store; s != nil; {
				if rs, ok := s.(*redisstore.Store); ok {
					st := rs.Stats()
					out.Calls, out.Errors = st.Calls, st.Errors
					break
				}
				u, ok := s.(interface{ Unwrap() sluice.Store })
				if !ok {
					break
				}
				s = u.Unwrap()
			}
			return out
		}))
	return reg
}

func metricsMux(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	return mux
}

// gatewayComponent runs the AI gateway inside `sluice serve` when the
// config has a `gateway:` section, on its own listener (gateway.listen),
// with the service's store and metrics registry. A change to the section
// takes a restart.
func gatewayComponent(d server.Deps) (server.Component, error) {
	cfg := d.Config()
	if cfg == nil || cfg.File == nil || cfg.File.Gateway == nil {
		return nil, nil
	}
	if err := checkGatewayKey(cfg.File.Gateway, os.Getenv, d.Logger); err != nil {
		return nil, err
	}
	gw, err := gateway.New(gateway.Options{Config: cfg.File.Gateway, Store: d.Store, Logger: d.Logger, Registerer: d.Metrics.Registry, WrapTransport: d.Tracing.Transport,
		OnOutcome: d.GatewayOutcome, OnSettled: d.GatewaySettled, Admin: d.IsAdmin})
	if err != nil {
		return nil, err
	}
	if d.SetGatewaySpend != nil {
		d.SetGatewaySpend(func(ctx context.Context) (any, error) { return gw.Spend(ctx, maxSpendClients) })
	}
	if d.SetGatewayUpstreams != nil {
		d.SetGatewayUpstreams(func(ctx context.Context) (any, error) { return gw.Upstreams(ctx) })
	}
	if d.SetGatewayLookup != nil {
		d.SetGatewayLookup(gw.LookUp)
	}
	srv := &gateway.Server{Gateway: gw, Addr: cfg.File.Gateway.Listen, Middleware: d.Tracing.Handler, HostsField: "gateway.allowed_hosts"}
	// Browsers reach it by the names of its own allowed_hosts and of the
	// service's (live, as the service reads them).
	own := hostcheck.OwnHosts()
	sec := cfg.File.Gateway
	srv.Hosts = func() *hostcheck.Policy {
		c := d.Config()
		return &hostcheck.Policy{Listen: []string{sec.Listen, c.Listen}, Allowed: append(slices.Clip(sec.AllowedHosts), c.AllowedHosts...), Own: own}
	}
	return srv, nil
}

// maxSpendClients bounds the clients whose budgets one read of the
// console's spend view peeks (a store call each).
const maxSpendClients = 500

// checkGatewayKey refuses a gateway whose upstream key variable is empty,
// as every request would then reach the upstream without a key, unless the
// upstream is on this machine or upstream.allow_no_key says it needs none;
// then it logs that no key is sent.
func checkGatewayKey(cfg *gateway.Config, getenv func(string) string, log *slog.Logger) error {
	if len(cfg.Upstreams) > 0 {
		return gateway.CheckKeys(cfg, getenv, os.ReadFile)
	}
	env := cfg.Upstream.APIKeyEnv
	if getenv(env) != "" {
		return nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch {
	case isLocalURL(cfg.Upstream.BaseURL):
		log.Info("gateway: no upstream key: the variable is empty, and the upstream is on this machine", "api_key_env", env, "upstream", redactedURL(cfg.Upstream.BaseURL))
		return nil
	case cfg.Upstream.AllowNoKey:
		log.Info("gateway: no upstream key: the variable is empty, and upstream.allow_no_key is set", "api_key_env", env, "upstream", redactedURL(cfg.Upstream.BaseURL))
		return nil
	}
	return fmt.Errorf("gateway: the upstream key variable %s is empty, so every request to %s would go without a key; "+
		"set %s, name another variable in upstream.api_key_env, or set upstream.allow_no_key: true for an upstream that needs none", env, redactedURL(cfg.Upstream.BaseURL), env)
}

// isLocalURL reports whether raw is an http(s) URL on this machine:
// localhost or a loopback address.
func isLocalURL(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
