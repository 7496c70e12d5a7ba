package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/internal/simulate"
)

// runScenario runs `sluice simulate --scenario NAME`: a built-in gateway
// queue scenario, its table, and the chart when asked.
func runScenario(cmd *cobra.Command, name, chart string) error {
	if c, ok := simulate.CalendarScenarios()[name]; ok {
		res, err := simulate.RunCalendar(cmd.Context(), c)
		if err != nil {
			return err
		}
		return res.WriteTable(cmd.OutOrStdout())
	}
	if b, ok := simulate.BudgetScenarios()[name]; ok {
		res, err := simulate.RunBudget(cmd.Context(), b)
		if err != nil {
			return err
		}
		return res.WriteTable(cmd.OutOrStdout())
	}
	all := simulate.Scenarios()
	s, ok := all[name]
	if !ok {
		names := slices.Concat(slices.Collect(maps.Keys(all)), slices.Collect(maps.Keys(simulate.BudgetScenarios())), slices.Collect(maps.Keys(simulate.CalendarScenarios())))
		slices.Sort(names)
		return fmt.Errorf("simulate: unknown scenario %q; valid: %s", name, strings.Join(names, ", "))
	}
	res, err := simulate.RunScenario(cmd.Context(), s)
	if err != nil {
		return err
	}
	return writeReport(cmd, res, chart)
}
