package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/simulate"
)

// runDelay runs `sluice simulate --max-wait D`: the algorithms among list
// that take delay mode, with and without it, the table, and the chart when
// asked.
func runDelay(cmd *cobra.Command, limit sluice.Limit, list []sluice.Algorithm, arrivals []time.Duration, bucket, maxWait time.Duration, chart string) error {
	var algos []sluice.Algorithm
	for _, a := range list {
		if sluice.Reserves(a) {
			algos = append(algos, a)
		}
	}
	if len(algos) == 0 {
		return fmt.Errorf("simulate: --max-wait needs gcra or token_bucket among --algorithms")
	}
	res, err := simulate.RunDelay(cmd.Context(), limit, algos, arrivals, bucket, maxWait)
	if err != nil {
		return err
	}
	return writeReport(cmd, res, chart)
}
