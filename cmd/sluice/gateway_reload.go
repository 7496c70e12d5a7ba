package main

import (
	"fmt"
	"log/slog"
	"reflect"
	"strings"

	"github.com/sluice-io/sluice/internal/gateway"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

// gatewayReloader applies a changed `sluice gateway` config file to the
// running server, as `sluice serve` reloads its own (internal/server's
// Reloader; when the file is whole is package filewatch's matter): the
// new file is parsed, validated and built into a new Gateway, whole, and
// served from then on; any failure refuses the whole file and the running
// config keeps serving. Either way one log line says so.
type gatewayReloader struct {
	path string
	// listen is the --listen flag, applied to each file as to the first.
	listen string
	srv    *gateway.Server
	// running is the config being served.
	running *gateway.Config
	// build makes a Gateway of a config, as the first one was made.
	build func(*gateway.Config) (*gateway.Gateway, error)
	log   *slog.Logger
}

// apply is filewatch.Watcher's Apply.
func (rl *gatewayReloader) apply(reason string, data []byte) {
	cfg, err := rl.load(data)
	if err != nil {
		rl.reject(reason, err)
		return
	}
	rl.running = cfg
	rl.log.Info("gateway config reloaded", "file", rl.path, "reason", reason, "tiers", len(cfg.Tiers), "keys", len(cfg.Keys))
}

// load parses data and builds its Gateway, or says why not.
func (rl *gatewayReloader) load(data []byte) (*gateway.Config, error) {
	cfg, err := gateway.Parse(rl.path, data)
	if err != nil {
		return nil, err
	}
	if rl.listen != "" {
		cfg.Listen = rl.listen
	}
	if changed := gatewayRestartOnly(rl.running, cfg); len(changed) > 0 {
		return nil, fmt.Errorf("gateway: %s changed, which takes a restart; nothing was applied, restart sluice gateway to apply the file", strings.Join(changed, ", "))
	}
	g, err := rl.build(cfg)
	if err != nil {
		return nil, err
	}
	rl.srv.SetGateway(g)
	return cfg, nil
}

// reject is filewatch.Watcher's Reject, and logs a refused file.
func (rl *gatewayReloader) reject(reason string, err error) {
	rl.log.Error("gateway config reload rejected; keeping the running config", "file", rl.path, "reason", reason, "err", err.Error())
}

// gatewayRestartOnly lists the settings that differ between the running
// config and next and that only a restart applies: the listen address
// and the store (opened once).
func gatewayRestartOnly(running, next *gateway.Config) []string {
	var out []string
	if running.Listen != next.Listen {
		out = append(out, "listen")
	}
	if !reflect.DeepEqual(running.Store, next.Store) {
		out = append(out, "store")
	}
	return out
}

// readConfigFile reads the file a reloader starts from, bounded as the
// loader bounds it; nil when it cannot, which only makes the first event
// reload the file.
func readConfigFile(path string) []byte {
	data, err := yamlconf.ReadFile(gateway.ErrInvalidConfig, path)
	if err != nil {
		return nil
	}
	return data
}
