// Command sluice is the sluice rate limiter's command-line tool: the
// service, the AI gateway, the batch client, the simulator and helpers.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	// Calendar limits name IANA time zones; the binary carries the zone
	// rules (about 450 KB) so that it needs none on the host (distroless
	// and scratch images have none) and answers the same everywhere.
	_ "time/tzdata"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The Go runtime's soft limit from the container's (memlimit.go);
	// here, not in run, so that tests driving run keep their own.
	setMemoryLimit("/sys/fs/cgroup")
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "sluice:", err)
		os.Exit(exitCode(err))
	}
}

// run executes the command line args; tests drive it directly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	return root.ExecuteContext(ctx)
}

// exitError carries a process exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	if e, ok := err.(*exitError); ok {
		return e.code
	}
	return 1
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "sluice",
		Short:         "sluice is a distributed rate limiter",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       versionString(),
	}
	root.SetVersionTemplate("sluice {{.Version}}\n")
	// Each subcommand lives in its own file of this package.
	root.AddCommand(
		newVersionCmd(),
		newServeCmd(),
		newConfigCmd(),
		newKeysCmd(),
		newLoadtestCmd(),
		newSimulateCmd(),
		newBatchCmd(),
		newGatewayCmd(),
		newHealthcheckCmd(),
	)
	return root
}
