package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/simulate"
)

func newSimulateCmd() *cobra.Command {
	var (
		pattern, limitText, algos, chart string
		scenario                         string
		rps                              float64
		duration, bucket, maxWait        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Replay a traffic pattern through the algorithms on a virtual clock",
		Long: `simulate replays a traffic pattern through rate-limit algorithms on a
virtual clock and prints, per second, what each one allowed and denied.

Patterns: steady, burst (a bulk client's spikes), ramp, or file:PATH with one
arrival per line (seconds since start, or RFC 3339 timestamps).

--scenario fairness or priority replays instead the gateway queue (priority
classes, reserved shares, fair queueing among keys) in front of a shared
model capacity, and prints per second what each flow got (docs/QUEUEING.md).

--max-wait D compares gcra and token_bucket with and without delay mode (the
max_wait of sluice serve's policies): held requests are counted when they go
ahead, so the table and chart show the burst smoothed instead of refused.

--scenario budget replays a dollar budget per calendar month in a time zone
over a simulated month of gateway traffic, and prints per local day what was
admitted, refused and spent (docs/gateway.md).

--scenario calendar replays a limit per local day in Europe/Berlin over
March 2026 (a 23-hour day on the 29th) beside the same rate per UTC day, and
prints per window when it started, how long it lasted, when it was spent and
the Retry-After it gave (docs/calendar.md).`,
		Example: `  sluice simulate
  sluice simulate --pattern ramp --rps 50 --limit "20/s burst 40" --chart ramp.svg
  sluice simulate --pattern file:arrivals.txt --algorithms token_bucket,sliding_window_log
  sluice simulate --scenario fairness --chart fairness.svg
  sluice simulate --max-wait 1s --limit "10/s burst 5" --chart delay.svg
  sluice simulate --scenario budget
  sluice simulate --scenario calendar`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if scenario != "" {
				return runScenario(cmd, scenario, chart)
			}
			limit, err := sluice.ParseLimit(limitText)
			if err != nil {
				return err
			}
			var list []sluice.Algorithm
			for _, name := range strings.Split(algos, ",") {
				a, err := sluice.ParseAlgorithm(name)
				if err != nil {
					return err
				}
				list = append(list, a)
			}
			var arrivals []time.Duration
			if path, ok := strings.CutPrefix(pattern, "file:"); ok {
				f, err := os.Open(path)
				if err != nil {
					return fmt.Errorf("simulate: %w", err)
				}
				defer f.Close()
				if arrivals, err = simulate.ReadArrivals(f); err != nil {
					return fmt.Errorf("%s: %w", path, err)
				}
			} else if arrivals, err = simulate.Generate(simulate.Pattern(pattern), rps, duration); err != nil {
				return err
			}
			if maxWait != 0 {
				return runDelay(cmd, limit, list, arrivals, bucket, maxWait, chart) // simulate_delay.go
			}
			res, err := simulate.Run(cmd.Context(), limit, list, arrivals, bucket)
			if err != nil {
				return err
			}
			return writeReport(cmd, res, chart)
		},
	}
	f := cmd.Flags()
	f.StringVar(&pattern, "pattern", "burst", "traffic: steady, burst, ramp or file:PATH")
	f.Float64Var(&rps, "rps", 20, "offered requests per second for the built-in patterns")
	f.DurationVar(&duration, "duration", 20*time.Second, "length of a built-in pattern")
	f.DurationVar(&maxWait, "max-wait", 0, "compare with delay mode: hold requests due within this wait (gcra and token_bucket)")
	f.StringVar(&limitText, "limit", "10/s burst 20", "the limit every algorithm enforces")
	f.StringVar(&algos, "algorithms", "token_bucket,gcra,sliding_window_log,sliding_window_counter,fixed_window", "comma-separated algorithms to compare")
	f.DurationVar(&bucket, "bucket", time.Second, "width of one table row")
	f.StringVar(&chart, "chart", "", "also write an SVG chart to this file")
	f.StringVar(&scenario, "scenario", "", "replay a scenario instead: fairness, priority, budget or calendar")
	return cmd
}

// simResult is a simulation's result: a table, and a chart.
type simResult interface {
	WriteTable(w io.Writer) error
	WriteSVG(w io.Writer) error
}

// writeReport prints r's table and, when chart names a file, writes r's
// chart there.
func writeReport(cmd *cobra.Command, r simResult, chart string) error {
	if err := r.WriteTable(cmd.OutOrStdout()); err != nil {
		return err
	}
	if chart == "" {
		return nil
	}
	f, err := os.Create(chart)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	if err := r.WriteSVG(f); err != nil {
		f.Close()
		return fmt.Errorf("simulate: writing %s: %w", chart, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("simulate: writing %s: %w", chart, err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "\nchart written to %s\n", chart)
	return nil
}
