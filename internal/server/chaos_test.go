package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/envoyrls"
	"github.com/sluice-io/sluice/internal/redistest"
)

// chaosLimit is the hot descriptor's limit: 300 an hour, a token bucket,
// so that the few seconds of the test refill less than one request.
const chaosLimit = 300

// chaosInstance is one `sluice serve` (API and Envoy gRPC) run in process.
type chaosInstance struct {
	log  *circuitLog
	api  string
	rls  rlsv3.RateLimitServiceClient
	conn *grpc.ClientConn
}

// circuitLog is a service's log, keeping the guard's circuit changes.
type circuitLog struct {
	mu     sync.Mutex
	lines  []string
	closes int // "circuit closed" lines
}

// Enabled is true from Info: the guard logs a closing at Info.
func (l *circuitLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }

// Handle keeps the lines about a circuit and counts its closings.
func (l *circuitLog) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "circuit") {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, r.Time.Format("15:04:05.000 ")+r.Message)
	if strings.Contains(r.Message, "circuit closed") {
		l.closes++
	}
	return nil
}

// WithAttrs returns l: the attributes are not kept.
func (l *circuitLog) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup returns l.
func (l *circuitLog) WithGroup(string) slog.Handler { return l }

// changes returns the closings counted so far and the lines kept.
func (l *circuitLog) changes() (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closes, strings.Join(l.lines, "; ")
}

// startChaosInstance runs the service with the Envoy component on a config
// naming url and policy, and connects a gRPC client to it.
func startChaosInstance(t *testing.T, dir, url, policy string) *chaosInstance {
	t.Helper()
	path := filepath.Join(dir, "sluice-"+strconv.Itoa(int(time.Now().UnixNano()))+".yaml")
	writeAtomic(t, path, fmt.Sprintf("policies:\n  p: {limit: 1/s}\nstore: {url: %q, failure_policy: %s}\nenvoy:\n  grpc_addr: 127.0.0.1:0\n  config_dir: rls\n", url, policy))
	api := make(chan net.Addr, 1)
	grpcAddr := make(chan net.Addr, 1)
	envoy := func(d Deps) (Component, error) {
		cfg := d.Config()
		svc, err := envoyrls.New(envoyrls.Options{Store: d.Store, ConfigDir: filepath.Join(dir, "rls"), Logger: d.Logger, Registerer: d.Metrics.Registry})
		if err != nil {
			return nil, err
		}
		return &envoyrls.Runner{Service: svc, GRPCAddr: cfg.File.Envoy.GRPCAddr, OnListen: func(name string, a net.Addr) {
			if name == "grpc" {
				grpcAddr <- a
			}
		}}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	in := &chaosInstance{log: &circuitLog{}}
	go func() {
		done <- Run(ctx, ServiceOptions{
			ConfigPath: path,
			Listen:     "127.0.0.1:0",
			Logger:     slog.New(in.log),
			OnListen:   func(a net.Addr) { api <- a },
			Components: []ComponentFunc{envoy},
			OnReload:   func(*config.Config, error) {},
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("service: %v", err)
		}
	})
	for range 2 {
		select {
		case a := <-api:
			in.api = "http://" + a.String()
		case a := <-grpcAddr:
			conn, err := grpc.NewClient(a.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			in.conn, in.rls = conn, rlsv3.NewRateLimitServiceClient(conn)
		case err := <-done:
			t.Fatalf("service exited: %v", err)
		case <-time.After(20 * time.Second):
			t.Fatal("service did not listen within 20s")
		}
	}
	return in
}

func (in *chaosInstance) get(t *testing.T, path string) answer {
	t.Helper()
	s := &svc{url: in.api}
	return s.do(t, "GET", path, "")
}

// TestChaosEnvoyPause: three `sluice serve` instances on one real Redis,
// 64 callers on one hot descriptor through the Envoy gRPC API, and Redis
// paused for 2 s (CLIENT PAUSE 2000 ALL) when half the limit is used.
// Under local (the default) the fleet admits at most 1.1 × the limit; under
// error the paused calls are UNAVAILABLE (Envoy's failure_mode_deny
// decides) and nothing is admitted beyond the limit. Afterwards /readyz of
// every instance is plain "ready" again with no traffic, and decisions
// come from Redis, not from the policy. Every instance's circuit opened
// (or, on a machine that starved the test's process of CPU, the guard
// counted late calls and probes it did not hold against Redis), and counted one opening
// for each time it opened, however many probes failed: a circuit opens again only after it closed, and a starved
// machine may see two slow probes in a row after the pause, so the
// openings are bounded by the closings the instance logged, plus one.
func TestChaosEnvoyPause(t *testing.T) {
	for _, policy := range []string{"local", "error"} {
		t.Run(policy, func(t *testing.T) {
			srv := redistest.NewStandalone(t)
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "rls"), 0o755); err != nil {
				t.Fatal(err)
			}
			rl := fmt.Sprintf("domain: chaos\ndescriptors:\n  - key: hot\n    rate_limit: {unit: hour, requests_per_unit: %d, algorithm: token_bucket}\n", chaosLimit)
			if err := os.WriteFile(filepath.Join(dir, "rls", "chaos.yaml"), []byte(rl), 0o644); err != nil {
				t.Fatal(err)
			}
			var ins []*chaosInstance
			for range 3 {
				ins = append(ins, startChaosInstance(t, dir, srv.URL(), policy))
			}
			// Each instance has learnt, by heartbeat, that three share the
			// limit.
			eventually(t, "three instances counted", func() (bool, string) {
				for _, in := range ins {
					if m := in.get(t, "/metrics").raw; !strings.Contains(m, "\nsluice_store_instances 3\n") {
						return false, metricLine(m, "sluice_store_instances")
					}
				}
				return true, ""
			})

			hot := &rlsv3.RateLimitRequest{Domain: "chaos", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "hot", Value: redistest.Prefix(t)}}},
			}}
			var admitted, denied, unavailable, other atomic.Int64
			var slowest atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			// The callers stop before the instances do, also when the test
			// fails half-way (else they keep calling, and starving the
			// machine, until the binary exits).
			stopCallers := sync.OnceFunc(func() {
				close(stop)
				wg.Wait()
			})
			t.Cleanup(stopCallers)
			for c := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						start := time.Now()
						resp, err := ins[(c+i)%3].rls.ShouldRateLimit(ctx, hot)
						cancel()
						if d := int64(time.Since(start)); d > slowest.Load() {
							slowest.Store(d)
						}
						switch {
						case err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
							admitted.Add(1)
						case err == nil:
							denied.Add(1)
						case status.Code(err) == codes.Unavailable:
							unavailable.Add(1)
						default:
							other.Add(1)
						}
					}
				}()
			}
			// Pause Redis once half the limit is used.
			eventually(t, "half the limit admitted", func() (bool, string) {
				return admitted.Load() >= chaosLimit/2, fmt.Sprint(admitted.Load())
			})
			if _, err := srv.Do(context.Background(), "CLIENT", "PAUSE", "2000", "ALL"); err != nil {
				t.Fatal(err)
			}
			paused := time.Now()
			eventually(t, "the pause to end", func() (bool, string) {
				return time.Since(paused) > 2500*time.Millisecond, ""
			})
			stopCallers()
			t.Logf("%s: admitted %d, denied %d, unavailable %d, other %d; limit %d; slowest call %s",
				policy, admitted.Load(), denied.Load(), unavailable.Load(), other.Load(), chaosLimit, time.Duration(slowest.Load()))
			if other.Load() != 0 {
				t.Errorf("%d calls failed with something else than UNAVAILABLE", other.Load())
			}
			bound := int64(chaosLimit) // error: exact, Redis decides every admission
			if policy == "local" {
				bound = chaosLimit * 11 / 10
			}
			if got := admitted.Load(); got > bound+1 { // +1: the bucket refills one request in 12 s
				t.Errorf("admitted %d, bound %d (limit %d)", got, bound, chaosLimit)
			}
			if policy == "local" && unavailable.Load() != 0 {
				t.Errorf("%d UNAVAILABLE under local", unavailable.Load())
			}

			// No traffic now: readiness and decisions come back by the probe.
			starvedAll := true
			for i, in := range ins {
				eventually(t, fmt.Sprintf("instance %d ready", i), func() (bool, string) {
					r := in.get(t, "/readyz")
					return r.status == 200 && r.raw == "ready\n", fmt.Sprintf("%d %s", r.status, r.raw)
				})
				resp, err := in.rls.ShouldRateLimit(context.Background(), hot)
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Errorf("instance %d after the pause: %v %v", i, resp, err)
				}
				for _, h := range resp.GetResponseHeadersToAdd() {
					if h.GetKey() == envoyrls.DegradedHeader {
						t.Errorf("instance %d: a degraded answer after Redis returned: %v", i, h)
					}
				}
				m := in.get(t, "/metrics").raw
				opens, err := strconv.Atoi(strings.TrimPrefix(metricLine(m, "sluice_store_circuit_opens_total"), "sluice_store_circuit_opens_total "))
				if err != nil {
					t.Fatalf("instance %d: %v", i, err)
				}
				// Read after the metric: the closings before it are in.
				starved, err := strconv.Atoi(strings.TrimPrefix(metricLine(m, "sluice_store_late_while_starved_total"), "sluice_store_late_while_starved_total "))
				if err != nil {
					t.Fatalf("instance %d: %v", i, err)
				}
				closes, lines := in.log.changes()
				if opens == 0 && starved > 0 {
					// The three instances share this process: on a loaded
					// machine it may be starved of CPU through the pause,
					// and then late answers are not held against Redis
					// (guard/cpu.go), as the guard counted.
					t.Logf("instance %d: no circuit opening; %d late calls and probes not counted, the process starved of CPU", i, starved)
					continue
				}
				starvedAll = false
				if opens < 1 || opens > closes+1 {
					t.Errorf("instance %d: %d circuit openings, %d closings (probes counted?); circuit log: %s", i, opens, closes, lines)
				}
			}
			// Under the error policy the pause shows as UNAVAILABLE, unless
			// every instance was starved of CPU through it (their late
			// answers excused, as counted above).
			if policy == "error" && unavailable.Load() == 0 && !starvedAll {
				t.Error("no UNAVAILABLE while Redis was paused under the error policy")
			}
		})
	}
}

// metricLine returns the sample line of an unlabelled metric.
func metricLine(m, name string) string {
	for _, l := range strings.Split(m, "\n") {
		if strings.HasPrefix(l, name+" ") {
			return l
		}
	}
	return name + " missing"
}
