package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/grpc"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/internal/hostcheck"
)

// Config is the `envoy:` section of sluice serve's configuration file:
//
//	envoy:
//	  grpc_addr: ":8081"          # envoyproxy/ratelimit's gRPC port
//	  config_dir: ratelimit/      # its YAML files, unchanged
//	  http_addr: ":8082"          # optional: /json and /healthcheck
//	  response_headers: true      # optional: RateLimit headers for Envoy to add
//	  response_dynamic_metadata: false # optional: RESPONSE_DYNAMIC_METADATA
//	  merge_domains: false        # optional: MERGE_DOMAIN_CONFIG
//	  max_request_bytes: 262144   # optional: one call's message, 4 KiB..4 MiB
//	  max_conns_per_peer: 64      # optional: one client IP's connections, 1..4096
//
// A relative config_dir is taken from the directory of the file it is in.
type Config struct {
	// GRPCAddr is the gRPC listen address; DefaultGRPCAddr when empty.
	GRPCAddr string `yaml:"grpc_addr"`
	// ConfigDir is the directory of rate-limit YAML files. Required.
	ConfigDir string `yaml:"config_dir"`
	// HTTPAddr, when set, serves POST /json and GET /healthcheck there, as
	// envoyproxy/ratelimit does on its HTTP port.
	HTTPAddr string `yaml:"http_addr"`
	// ResponseHeaders sets Options.ResponseHeaders.
	ResponseHeaders bool `yaml:"response_headers"`
	// ResponseDynamicMetadata sets Options.ResponseDynamicMetadata
	// (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA).
	ResponseDynamicMetadata bool `yaml:"response_dynamic_metadata"`
	// MergeDomains sets Options.MergeDomains.
	MergeDomains bool `yaml:"merge_domains"`
	// Lease sets Options.Lease: every descriptor as if `lease: true`.
	Lease bool `yaml:"lease"`
	// MaxRequestBytes sets Limits.MaxRequestBytes; 0 means the default.
	MaxRequestBytes int `yaml:"max_request_bytes"`
	// MaxConnsPerPeer sets Limits.MaxConnsPerPeer; 0 means the default.
	MaxConnsPerPeer int `yaml:"max_conns_per_peer"`
}

// Limits returns the section's bounds on one client of the gRPC port.
func (c *Config) Limits() Limits {
	return Limits{MaxRequestBytes: c.MaxRequestBytes, MaxConnsPerPeer: c.MaxConnsPerPeer}
}

// Validate checks the section.
func (c *Config) Validate() error {
	if c.ConfigDir == "" {
		return errors.New("config_dir is required: the directory of envoyproxy/ratelimit YAML files")
	}
	for _, a := range []struct{ name, addr string }{{"grpc_addr", c.GRPCAddr}, {"http_addr", c.HTTPAddr}} {
		if a.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return fmt.Errorf("%s %q: %v", a.name, a.addr, err)
		}
	}
	return c.Limits().Validate()
}

// Runner runs a Service as one part of a larger server: the gRPC listener,
// the optional HTTP listener and the configuration watch. It has the
// Name and Run methods of sluice serve's components.
type Runner struct {
	// Service answers the checks.
	Service *Service
	// GRPCAddr is where gRPC is served; DefaultGRPCAddr when empty.
	GRPCAddr string
	// HTTPAddr, when set, is where /json and /healthcheck are served.
	HTTPAddr string
	// OnListen, if set, is called with each listener's name ("grpc" or
	// "http") and address once it is listening.
	OnListen func(name string, addr net.Addr)
	// GRPCOptions are added to the gRPC server's (tracing's stats handler).
	GRPCOptions []grpc.ServerOption
	// Limits bound what one client can make the gRPC server do
	// (fairness.go); the zero value means the defaults.
	Limits Limits
	// Extras are more services on the gRPC server, such as the quota
	// service of internal/rlqs.
	Extras []Extra
	// Hosts, when set, returns at each request the names the HTTP
	// listener is known by (package hostcheck): a browser's request to
	// /json or /healthcheck whose Host is not among them is refused with
	// 403, as a page that rebinds its name to this address could
	// otherwise spend any descriptor's limit. Nil means the host of
	// HTTPAddr and this machine's names (and IP addresses and localhost,
	// always).
	Hosts func() *hostcheck.Policy
}

// httpHandler is the HTTP listener's handler: HTTPHandler behind the
// Host check.
func (r *Runner) httpHandler() http.Handler {
	hosts := r.Hosts
	if hosts == nil {
		p := &hostcheck.Policy{Listen: []string{r.HTTPAddr}, Own: hostcheck.OwnHosts()}
		hosts = func() *hostcheck.Policy { return p }
	}
	// /json is a POST, which a browser always marks with Origin; what
	// /healthcheck reads is no secret. So only a browser's request is
	// checked, and ERL's clients keep whatever Host they send.
	rule := func(*http.Request) hostcheck.Check { return hostcheck.IfBrowser }
	return hostcheck.Guard(r.Service.HTTPHandler(), hosts, rule, func(w http.ResponseWriter, req *http.Request) {
		http.Error(w, "envoyrls: "+hostcheck.Message(req.Host, "allowed_hosts"), http.StatusForbidden)
	})
}

// Name implements sluice serve's component interface.
func (r *Runner) Name() string { return "envoy" }

// Run serves until ctx is done, then stops gracefully.
func (r *Runner) Run(ctx context.Context) error {
	if err := r.Limits.Validate(); err != nil {
		return fmt.Errorf("envoyrls: %w", err)
	}
	addr := r.GRPCAddr
	if addr == "" {
		addr = DefaultGRPCAddr
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("envoyrls: listen gRPC: %w", err)
	}
	log := r.Service.log
	log.Info("envoy rate limit service listening", "grpc", lis.Addr().String(), "config_dir", r.Service.dir, "domains", r.Service.Domains())
	if r.OnListen != nil {
		r.OnListen("grpc", lis.Addr())
	}
	lis = guardListener(lis, r.Limits.withDefaults(), log, r.Service.metrics)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	running := 2
	go func() { errc <- r.Service.serve(ctx, lis, r.Extras, r.GRPCOptions...) }()
	go func() { errc <- r.Service.Watch(ctx) }()
	if r.HTTPAddr != "" {
		hl, err := net.Listen("tcp", r.HTTPAddr)
		if err != nil {
			cancel()
			for range running {
				<-errc
			}
			return fmt.Errorf("envoyrls: listen HTTP: %w", err)
		}
		log.Info("envoy rate limit /json listening", "http", hl.Addr().String())
		if r.OnListen != nil {
			r.OnListen("http", hl.Addr())
		}
		running++
		go func() { errc <- serveHTTP(ctx, hl, r.httpHandler(), log) }()
	}
	var first error
	for range running {
		if err := <-errc; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

// HTTPHandler serves envoyproxy/ratelimit's HTTP endpoints: POST /json and
// GET /healthcheck.
func (s *Service) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/json", s.JSONHandler())
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("OK"))
	})
	return mux
}

func serveHTTP(ctx context.Context, lis net.Listener, h http.Handler, log *slog.Logger) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("envoyrls: serve HTTP: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-errc
		return nil
	}
}

// CheckDir loads a directory of envoyproxy/ratelimit YAML files the way the
// service does, offline, and returns the number of domains in it. Its
// errors name the file and the problem, as the service's do. regions are
// serve's store.region and store.regions (Options.Regions): without them a
// rule with `scope: global` is an error.
func CheckDir(dir string, merge bool, regions ...string) (int, error) {
	files, err := readDir(dir)
	if err != nil {
		return 0, err
	}
	m, err := newMetrics(prometheus.NewRegistry(), 0)
	if err != nil {
		return 0, err
	}
	rs, err := parseConfig(files, merge, m, regions)
	if err != nil {
		return 0, err
	}
	return len(rs.domains), nil
}

// CheckFiles loads the envoyproxy/ratelimit YAML files at paths offline
// as one configuration, as if they were a directory of their own (a
// directory that also holds other files, say), and returns the number of
// domains in them. regions are as CheckDir's.
func CheckFiles(paths []string, merge bool, regions ...string) (int, error) {
	if len(paths) > maxConfigFiles {
		return 0, fmt.Errorf("%w: more than %d config files", ErrConfig, maxConfigFiles)
	}
	files := make([]configFile, 0, len(paths))
	for _, path := range paths {
		data, err := readConfigFile(path)
		if err != nil {
			return 0, err
		}
		files = append(files, configFile{name: path, data: data})
	}
	m, err := newMetrics(prometheus.NewRegistry(), 0)
	if err != nil {
		return 0, err
	}
	rs, err := parseConfig(files, merge, m, regions)
	if err != nil {
		return 0, err
	}
	return len(rs.domains), nil
}

// readConfigFile reads one file, refusing one larger than maxConfigBytes.
func readConfigFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: %w", err)
	}
	if fi.Size() > maxConfigBytes {
		return nil, fmt.Errorf("%w: %s: file is larger than %d bytes", ErrConfig, path, maxConfigBytes)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: %w", err)
	}
	return data, nil
}

// CheckFile loads one envoyproxy/ratelimit YAML file offline, as CheckDir
// does a directory, and returns the number of domains in it. regions are
// as CheckDir's.
func CheckFile(path string, regions ...string) (int, error) {
	data, err := readConfigFile(path)
	if err != nil {
		return 0, err
	}
	m, err := newMetrics(prometheus.NewRegistry(), 0)
	if err != nil {
		return 0, err
	}
	rs, err := parseConfig([]configFile{{name: path, data: data}}, false, m, regions)
	if err != nil {
		return 0, err
	}
	return len(rs.domains), nil
}
