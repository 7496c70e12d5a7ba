package main

import (
	"errors"
	"path/filepath"

	"github.com/sluice-io/sluice/internal/envoyrls"
	"github.com/sluice-io/sluice/internal/hostcheck"
	"github.com/sluice-io/sluice/internal/rlqs"
	"github.com/sluice-io/sluice/internal/server"
	"github.com/sluice-io/sluice/region"
)

// envoyComponent runs the Envoy rate limit service (internal/envoyrls)
// inside `sluice serve` when the config has an `envoy:` section. Its YAML
// directory is watched on its own; a change to the `envoy:` section itself
// takes a restart.
func envoyComponent(d server.Deps) (server.Component, error) {
	cfg := d.Config()
	if cfg == nil || cfg.File == nil {
		return nil, nil
	}
	if cfg.File.Envoy == nil {
		if cfg.File.RLQS != nil {
			return nil, errors.New("rlqs: the rlqs: section is served on the envoy: section's gRPC port; add an envoy: section")
		}
		return nil, nil
	}
	sec := cfg.File.Envoy
	dir := sec.ConfigDir
	if !filepath.IsAbs(dir) && cfg.Path != "" {
		dir = filepath.Join(filepath.Dir(cfg.Path), dir)
	}
	svc, err := envoyrls.New(envoyrls.Options{
		Store:                   d.Store,
		ConfigDir:               dir,
		Logger:                  d.Logger,
		Registerer:              d.Metrics.Registry,
		ResponseHeaders:         sec.ResponseHeaders,
		ResponseDynamicMetadata: sec.ResponseDynamicMetadata,
		MergeDomains:            sec.MergeDomains,
		Lease:                   sec.Lease,
		Regions:                 cfg.Store.RegionNames(),
	})
	if err != nil {
		return nil, err
	}
	r := &envoyrls.Runner{Service: svc, GRPCAddr: sec.GRPCAddr, HTTPAddr: sec.HTTPAddr, GRPCOptions: d.Tracing.GRPCServerOptions(), Limits: sec.Limits()}
	// /json answers browsers by the names the service does: the config's
	// allowed_hosts (live, as the service reads them), the hosts of
	// http_addr and listen, this machine's names.
	own := hostcheck.OwnHosts()
	r.Hosts = func() *hostcheck.Policy {
		c := d.Config()
		return &hostcheck.Policy{Listen: []string{sec.HTTPAddr, c.Listen}, Allowed: c.AllowedHosts, Own: own}
	}
	if cfg.File.RLQS != nil {
		// A reload's rlqs: section reaches every bucket at its next report.
		live := func() *rlqs.Config {
			if c := d.Config(); c != nil && c.File != nil {
				return c.File.RLQS
			}
			return nil
		}
		opts := rlqs.Options{Store: d.Store, Config: cfg.File.RLQS, Live: live, Logger: d.Logger, Registerer: d.Metrics.Registry}
		if rs := region.Find(d.Store); rs != nil {
			// Global policies lease their capacity at their home region's
			// store, through the region store's connections (docs/regions.md).
			opts.Global = &rlqs.Global{Region: rs.Region(), StoreOf: rs.StoreOf, HomeOf: rs.HomeOf, FailOpen: rs.FailurePolicy() == region.FailOpen}
		}
		q, err := rlqs.New(opts)
		if err != nil {
			return nil, err
		}
		r.Extras = append(r.Extras, q)
	}
	return r, nil
}
