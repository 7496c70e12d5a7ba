package main

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/envoyrls"
	"github.com/sluice-io/sluice/internal/gateway"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with config files",
	}
	var kind string
	var env bool
	check := &cobra.Command{
		Use:   "check FILE|DIR...",
		Short: "Validate config files offline; exit 1 if any is invalid",
		Long: `check validates sluice's config files offline and reports every problem of
each file at once, as FILE:LINE: FIELD: MESSAGE with the valid values.

It tells the kind of each file from its fields: a 'sluice serve' config
(policies, tiers of policies, authz; with its gateway: section and the
envoy: section's config_dir), a 'sluice gateway' config (upstream, tiers
of rpm/tpm limits) or an envoyproxy/ratelimit file (domain, descriptors).
A directory's YAML files (*.yaml, *.yml, not hidden) are told apart the
same way: a directory of envoyproxy/ratelimit files only is checked as
one config directory (domains unique across its files, as 'sluice serve'
loads envoy.config_dir); in a directory that mixes kinds, such as
examples/, each sluice config is checked on its own and the
envoyproxy/ratelimit files together; a YAML file with no field of any of
these (an Envoy bootstrap, a Compose file) is skipped and said so. --kind
overrides the detection (--kind envoy takes a directory as a rules
directory whatever it holds).

Offline means it reads nothing but the files: a gateway's upstream keys,
which are in the environment where the gateway runs and often not where
its config is checked, are not looked for unless --env is given; then a
missing key variable or key_file is a problem too.`,
		Example: "  sluice config check examples/sluice.yaml examples/gateway.yaml\n  sluice config check deploy/envoy/ratelimit examples/\n  sluice config check --env gateway.yaml   # where it runs: its keys too",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			force, err := parseKind(kind)
			if err != nil {
				return err
			}
			bad := 0
			for _, path := range args {
				if !checkConfig(cmd.OutOrStdout(), cmd.ErrOrStderr(), path, force, env) {
					bad++
				}
			}
			if bad > 0 {
				return &exitError{code: 1, err: checkError(fmt.Sprintf("config check: %d of %d invalid", bad, len(args)))}
			}
			return nil
		},
	}
	check.Flags().StringVar(&kind, "kind", "auto", "file kind: auto, serve, gateway or envoy")
	check.Flags().BoolVar(&env, "env", false, "also check that every gateway upstream's key variable or key_file is set here")
	cmd.AddCommand(check)
	return cmd
}

// checkError is the failure of `config check`; it matches config.ErrInvalid
// without repeating its text after the problems already printed.
type checkError string

func (e checkError) Error() string        { return string(e) }
func (e checkError) Is(target error) bool { return target == config.ErrInvalid }

func parseKind(s string) (config.Kind, error) {
	switch s {
	case "", "auto":
		return config.KindUnknown, nil
	case "serve":
		return config.KindServe, nil
	case "gateway":
		return config.KindGateway, nil
	case "envoy":
		return config.KindEnvoy, nil
	}
	return 0, fmt.Errorf("--kind %q: valid: auto, serve, gateway, envoy", s)
}

// checkConfig checks one file or directory, printing "PATH: ok: ..." to out
// or every problem to errOut, and reports whether it is valid; with env,
// a gateway's upstream keys must be in this environment too.
func checkConfig(out, errOut io.Writer, path string, kind config.Kind, env bool) bool {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return checkDir(out, errOut, path, kind, env)
	}
	data, err := yamlconf.ReadFile(config.ErrInvalid, path)
	if err != nil {
		report(errOut, path, config.KindUnknown, err)
		return false
	}
	if kind == config.KindUnknown {
		kind = config.Detect(data)
	}
	switch kind {
	case config.KindEnvoy:
		n, err := envoyrls.CheckFile(path)
		if err != nil {
			report(errOut, path, kind, err)
			return false
		}
		fmt.Fprintf(out, "%s: ok: %s, %d domains\n", path, kind, n)
		return true
	case config.KindGateway:
		cfg, err := gateway.Parse(path, data)
		if err != nil {
			report(errOut, path, kind, err)
			return false
		}
		if env {
			if err := gateway.CheckKeys(cfg, os.Getenv, os.ReadFile); err != nil {
				report(errOut, path, kind, err)
				return false
			}
		}
		fmt.Fprintf(out, "%s: ok: %s: %d tiers, %d keys, %s, store %s\n",
			path, kind, len(cfg.Tiers), len(cfg.Keys), upstreamSummary(cfg), storeName(cfg.Store.URL))
		return true
	}
	cfg, err := config.Parse(path, data)
	if err != nil {
		report(errOut, path, config.KindServe, err)
		return false
	}
	fmt.Fprintf(out, "%s: ok: %s: %d policies, %d tiers, %d keys, %d overrides, store %s (%s)\n",
		path, config.KindServe, len(cfg.Policies), len(cfg.Tiers), len(cfg.Keys), len(cfg.File.Overrides), storeName(cfg.Store.URL), cfg.Store.FailurePolicy)
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(errOut, "%s: warning: %s\n", path, w)
	}
	ok := true
	if gw := cfg.File.Gateway; gw != nil {
		fmt.Fprintf(out, "%s: ok: gateway section: %d tiers, %d keys, %s\n", path, len(gw.Tiers), len(gw.Keys), upstreamSummary(gw))
		if env {
			if err := gateway.CheckKeys(gw, os.Getenv, os.ReadFile); err != nil {
				report(errOut, path, config.KindServe, err)
				ok = false
			}
		}
	}
	if sec := cfg.File.Envoy; sec != nil {
		dir := sec.ConfigDir
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(filepath.Dir(path), dir)
		}
		n, err := envoyrls.CheckDir(dir, sec.MergeDomains, cfg.Store.RegionNames()...)
		if err != nil {
			reportAs(errOut, fmt.Sprintf("%s: envoy.config_dir %s: invalid envoyproxy/ratelimit config", path, dir), err)
			ok = false
		} else {
			fmt.Fprintf(out, "%s: ok: envoy config_dir %s, %d domains\n", path, dir, n)
		}
	}
	return ok
}

// checkDir checks a directory's YAML files, each by its kind (or all as
// kind when it is given): the envoyproxy/ratelimit files as one rules
// directory, each other file on its own (with env, as checkConfig).
func checkDir(out, errOut io.Writer, dir string, kind config.Kind, env bool) bool {
	files, err := yamlFiles(dir)
	if err != nil {
		fmt.Fprintf(errOut, "%s: %v\n", dir, err)
		return false
	}
	var envoy, others []string
	for _, f := range files {
		k := kind
		if k == config.KindUnknown {
			data, err := yamlconf.ReadFile(config.ErrInvalid, f)
			if err != nil {
				report(errOut, f, config.KindUnknown, err)
				return false
			}
			if !config.Recognised(data) {
				fmt.Fprintf(out, "%s: skipped: no field of a sluice or envoyproxy/ratelimit config\n", f)
				continue
			}
			k = config.Detect(data)
		}
		if k == config.KindEnvoy {
			envoy = append(envoy, f)
		} else {
			others = append(others, f)
		}
	}
	if len(others) == 0 {
		n, err := envoyrls.CheckDir(dir, false)
		if err != nil {
			reportAs(errOut, dir+": invalid envoyproxy/ratelimit config directory", err)
			return false
		}
		fmt.Fprintf(out, "%s: ok: envoyproxy/ratelimit config, %d domains\n", dir, n)
		return true
	}
	ok := true
	for _, f := range others {
		ok = checkConfig(out, errOut, f, kind, env) && ok
	}
	if len(envoy) > 0 {
		n, err := envoyrls.CheckFiles(envoy, false)
		if err != nil {
			reportAs(errOut, fmt.Sprintf("%s: invalid envoyproxy/ratelimit config (%d files)", dir, len(envoy)), err)
			return false
		}
		fmt.Fprintf(out, "%s: ok: envoyproxy/ratelimit config, %d files, %d domains\n", dir, len(envoy), n)
	}
	return ok
}

// yamlFiles lists the YAML files directly in dir as the Envoy rate limit
// service reads a config_dir (envoyrls.ConfigPaths).
func yamlFiles(dir string) ([]string, error) {
	paths, err := envoyrls.ConfigPaths(dir)
	if err != nil {
		return nil, fmt.Errorf("config check: %w", err)
	}
	return paths, nil
}

// report prints err under a header naming the file and its kind: a
// *yamlconf.Error as its count and list of problems.
func report(w io.Writer, path string, kind config.Kind, err error) {
	reportAs(w, fmt.Sprintf("%s: invalid %s", path, kind), err)
}

// reportAs prints err under head: a *yamlconf.Error (from any of the
// loaders, the Envoy one included) as its count and list of problems.
func reportAs(w io.Writer, head string, err error) {
	var ye *yamlconf.Error
	if !errors.As(err, &ye) {
		fmt.Fprintf(w, "%s:\n  %s\n", head, envoyProblems(err))
		return
	}
	noun := "problems"
	if len(ye.Problems) == 1 {
		noun = "problem"
	}
	fmt.Fprintf(w, "%s, %d %s:\n", head, len(ye.Problems), noun)
	for _, p := range ye.Problems {
		fmt.Fprintf(w, "  %s\n", p)
	}
}

// envoyProblems indents an error that is not a *yamlconf.Error, such as
// the Envoy loader's for a directory too large, without its package's
// prefix on every line.
func envoyProblems(err error) string {
	prefix := envoyrls.ErrConfig.Error() + ": "
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, prefix)
	}
	return strings.Join(lines, "\n  ")
}

// redactedURL is raw with the password of its user info hidden
// (url.URL.Redacted), for output that may be logged: `config check` runs in
// CI, whose logs many can read.
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}

func storeName(url string) string {
	if url == "" || url == "memory" {
		return "memory"
	}
	return "redis"
}

// upstreamSummary describes a gateway's upstreams for config check.
func upstreamSummary(cfg *gateway.Config) string {
	if len(cfg.Upstreams) > 0 {
		return fmt.Sprintf("%d upstreams, %d routes", len(cfg.Upstreams), len(cfg.Routes))
	}
	return "upstream " + redactedURL(cfg.Upstream.BaseURL)
}
