package envoyrls

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"google.golang.org/grpc/grpclog"
)

// GRPCLogger returns a grpclog.LoggerV2 that writes grpc-go's own log
// lines (transport errors, bad clients) through the logger that current
// returns, at the matching level and with component=grpc, instead of
// grpc-go's default plain-text logger on stderr. grpc-go's logger is
// process-wide and may be installed only once, before any gRPC use
// (grpclog.SetLoggerV2); current lets the command point it at each run's
// logger. Info lines are logged at debug level, as grpc-go's default hides
// them.
func GRPCLogger(current func() *slog.Logger) grpclog.LoggerV2 {
	return grpcLogger{current}
}

type grpcLogger struct{ log func() *slog.Logger }

func (g grpcLogger) out(level slog.Level, msg string) {
	if l := g.log(); l != nil {
		l.Log(context.Background(), level, strings.TrimSpace(msg), "component", "grpc")
	}
}

func (g grpcLogger) Info(args ...any)   { g.out(slog.LevelDebug, fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any) { g.out(slog.LevelDebug, fmt.Sprintln(args...)) }
func (g grpcLogger) Infof(format string, args ...any) {
	g.out(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Warning(args ...any)   { g.out(slog.LevelWarn, fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any) { g.out(slog.LevelWarn, fmt.Sprintln(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) {
	g.out(slog.LevelWarn, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Error(args ...any)   { g.out(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any) { g.out(slog.LevelError, fmt.Sprintln(args...)) }
func (g grpcLogger) Errorf(format string, args ...any) {
	g.out(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal logs and exits, as grpclog.LoggerV2 requires.
func (g grpcLogger) Fatal(args ...any) { g.out(slog.LevelError, fmt.Sprint(args...)); os.Exit(1) }

// Fatalln logs and exits, as grpclog.LoggerV2 requires.
func (g grpcLogger) Fatalln(args ...any) { g.out(slog.LevelError, fmt.Sprintln(args...)); os.Exit(1) }

// Fatalf logs and exits, as grpclog.LoggerV2 requires.
func (g grpcLogger) Fatalf(format string, args ...any) {
	g.out(slog.LevelError, fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V reports whether grpc-go's verbose level l is logged: level 0 when the
// handler takes debug lines, no deeper.
func (g grpcLogger) V(l int) bool {
	lg := g.log()
	return l <= 0 && lg != nil && lg.Enabled(context.Background(), slog.LevelDebug)
}
