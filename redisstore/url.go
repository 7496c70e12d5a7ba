package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Environment variables that supply credentials the URL leaves out.
const (
	EnvUsername = "SLUICE_REDIS_USERNAME"
	EnvPassword = "SLUICE_REDIS_PASSWORD"
)

// clientOption turns a Redis URL into rueidis options. Accepted forms:
//
//	redis://[user:password@]host[:port][/db]            standalone
//	rediss://...                                        standalone over TLS
//	redis+cluster://[user:password@]h1:p1,h2:p2,...      Cluster, any seeds
//	rediss+cluster://...                                Cluster over TLS
//	redis+sentinel://[user:password@]s1:p1,s2:p2/master  Sentinel
//	rediss+sentinel://...                               Sentinel over TLS
//
// "redis-cluster" and "redis-sentinel" are accepted for the "+" forms.
// Query parameters: dial_timeout (a Go duration), skip_verify (TLS, tests
// only), ca_file (TLS: a PEM file of CA certificates to trust instead of
// the system roots), sentinel_password (if the sentinels need their own).
// Credentials missing from the URL come from username and password, then from
// SLUICE_REDIS_USERNAME and SLUICE_REDIS_PASSWORD. Errors never contain
// the password.
func clientOption(raw, username, password string) (rueidis.ClientOption, string, error) {
	var opt rueidis.ClientOption
	bad := func(format string, args ...any) (rueidis.ClientOption, string, error) {
		return opt, "", fmt.Errorf("%w: %s", ErrBadURL, fmt.Sprintf(format, args...))
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return bad("want a URL such as redis://host:6379")
	}
	scheme = strings.ToLower(scheme)
	mode := "standalone"
	tlsOn := false
	switch scheme {
	case "redis":
	case "rediss":
		tlsOn = true
	case "redis+cluster", "redis-cluster", "rediss+cluster", "rediss-cluster":
		mode = "cluster"
		tlsOn = strings.HasPrefix(scheme, "rediss")
	case "redis+sentinel", "redis-sentinel", "rediss+sentinel", "rediss-sentinel":
		mode = "sentinel"
		tlsOn = strings.HasPrefix(scheme, "rediss")
	default:
		return bad("unknown scheme %q; use redis, rediss, redis+cluster or redis+sentinel", scheme)
	}
	// url.Parse rejects several host:port pairs, so cut the hosts out first.
	rest, query, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	userinfo := ""
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, authority = authority[:i], authority[i+1:]
	}
	if userinfo != "" {
		u, err := url.Parse("redis://" + userinfo + "@x")
		if err != nil || u.User == nil {
			return bad("malformed credentials")
		}
		opt.Username = u.User.Username()
		opt.Password, _ = u.User.Password()
	}
	if opt.Username == "" {
		opt.Username = username
	}
	if opt.Password == "" {
		opt.Password = password
	}
	if opt.Username == "" {
		opt.Username = os.Getenv(EnvUsername)
	}
	if opt.Password == "" {
		opt.Password = os.Getenv(EnvPassword)
	}
	var hosts []string
	for _, h := range strings.Split(authority, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			port := "6379"
			if mode == "sentinel" {
				port = "26379"
			}
			h = net.JoinHostPort(strings.Trim(h, "[]"), port)
		}
		hosts = append(hosts, h)
	}
	if len(hosts) == 0 {
		return bad("no host")
	}
	if mode == "standalone" && len(hosts) > 1 {
		return bad("%d hosts for a standalone server; use redis+cluster:// or redis+sentinel://", len(hosts))
	}
	opt.InitAddress = hosts
	q, err := url.ParseQuery(query)
	if err != nil {
		return bad("query: %v", err)
	}
	if v := q.Get("dial_timeout"); v != "" {
		if opt.Dialer.Timeout, err = time.ParseDuration(v); err != nil {
			return bad("dial_timeout %q: %v", v, err)
		}
	}
	if tlsOn {
		host, _, _ := net.SplitHostPort(hosts[0])
		opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
		if v := q.Get("skip_verify"); v != "" {
			skip, err := strconv.ParseBool(v)
			if err != nil {
				return bad("skip_verify %q: %v", v, err)
			}
			opt.TLSConfig.InsecureSkipVerify = skip
		}
		if v := q.Get("ca_file"); v != "" {
			pemBytes, err := os.ReadFile(v)
			if err != nil {
				return bad("ca_file: %v", err)
			}
			opt.TLSConfig.RootCAs = x509.NewCertPool()
			if !opt.TLSConfig.RootCAs.AppendCertsFromPEM(pemBytes) {
				return bad("ca_file %q holds no PEM certificate", v)
			}
		}
	} else if q.Has("ca_file") {
		return bad("ca_file needs TLS: use rediss://")
	}
	switch mode {
	case "standalone":
		opt.ForceSingleClient = true
		if path != "" {
			if opt.SelectDB, err = strconv.Atoi(path); err != nil || opt.SelectDB < 0 {
				return bad("database %q is not a number", path)
			}
		}
	case "cluster":
		if path != "" {
			return bad("a Cluster URL has no database path")
		}
		opt.ClusterOption.ShardsRefreshInterval = 10 * time.Second
	case "sentinel":
		if path == "" {
			return bad("a Sentinel URL needs the master set name as its path, as in redis+sentinel://host:26379/mymaster")
		}
		master, db, _ := strings.Cut(path, "/")
		opt.Sentinel = rueidis.SentinelOption{
			MasterSet:               master,
			TLSConfig:               opt.TLSConfig,
			Username:                opt.Username,
			Password:                q.Get("sentinel_password"),
			TopologyRefreshInterval: 5 * time.Second,
		}
		if db != "" {
			if opt.SelectDB, err = strconv.Atoi(db); err != nil || opt.SelectDB < 0 {
				return bad("database %q is not a number", db)
			}
		}
	}
	return opt, mode, nil
}
