package config

import "fmt"

// Warnings lists the settings of a valid configuration that are allowed
// but cost more than they seem to, each as "path: what it costs". `sluice
// config check` prints them; they never make a configuration invalid.
func (c *Config) Warnings() []string {
	var out []string
	if c.Store.FailurePolicy == FailOpen && !c.Store.IsMemory() {
		out = append(out, fmt.Sprintf("store.failure_policy: %s admits every request the store cannot answer in time: "+
			"each call that misses the %s timeout, and every call while Redis is away, is admitted, so no limit holds then "+
			"(a 2 s Redis pause under load can admit many times the limit); %s keeps limit ÷ instances on each instance, "+
			"%s leaves the decision to the proxy (Envoy failure_mode_deny)", FailOpen, c.Store.Timeout, FailLocal, "error"))
	}
	return out
}
