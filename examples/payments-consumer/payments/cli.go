// Package payments is the payments-consumer service (the command in the
// directory above): it consumes payment events from Kafka and records them in
// PostgreSQL so that every retry is safe. Its command runs [Main]; a wrapper
// binary may run it with [Hooks] that add flags and wrap the handlers.
package payments

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/handler"
)

// Main runs the command with os.Args until SIGINT or SIGTERM, and exits the
// process: status 0 on a clean stop, 2 on a usage error, 1 on any other
// error (printed to stderr as "payments-consumer: <error>"). hooks extend the
// consumer; the zero Hooks run the service as it is.
func Main(hooks Hooks) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, hooks)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "payments-consumer:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "payments-consumer:", err)
		os.Exit(1)
	}
}

// Hooks extend the consumer (not the demo) of a wrapper binary. Every field
// is optional.
type Hooks struct {
	// Flags declares the wrapper's own flags on the consumer's flag set,
	// before it is parsed.
	Flags func(fs *flag.FlagSet)
	// Wrap is called once, after the flags are parsed and the database is
	// migrated, and before the consumer runs. It gets the processing mode
	// (-mode), the service's pool and handler (a batch handler,
	// handler.Batch, in mode batch-handler), and returns the handler to run
	// (a wrapper calls h and may write in the message's transaction,
	// dedupe.Tx(ctx); it wraps a batch handler in a batch handler) and a func
	// called once the consumer has stopped, whose error is returned with the
	// consumer's. An error stops the command before the consumer runs.
	Wrap func(ctx context.Context, mode string, pool *pgxpool.Pool, h handler.Handler) (handler.Handler, func() error, error)
}

// UsageErrorf returns an error that Main reports as a usage error (exit
// status 2), for a wrapper's invalid flags.
func UsageErrorf(format string, args ...any) error { return usagef(format, args...) }

// usageError marks errors the user fixes on the command line or in the
// environment (exit status 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// run dispatches to the consumer (the default) or the demo subcommand.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, hooks Hooks) error {
	if len(args) > 0 && args[0] == "demo" {
		return demoMain(ctx, args[1:], stdout, stderr)
	}
	return serveMain(ctx, args, stderr, hooks)
}

// env is what the service reads from its environment.
type env struct {
	Brokers     []string // KAFKA_BROKERS, comma-separated host:port
	DatabaseURL string   // DATABASE_URL, a PostgreSQL connection URL
}

// loadEnv reads KAFKA_BROKERS and DATABASE_URL and reports every missing one.
func loadEnv() (env, error) {
	var e env
	var missing []string
	for _, b := range strings.Split(os.Getenv("KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			e.Brokers = append(e.Brokers, b)
		}
	}
	if len(e.Brokers) == 0 {
		missing = append(missing, "KAFKA_BROKERS (comma-separated host:port, e.g. 127.0.0.1:9092)")
	}
	e.DatabaseURL = strings.TrimSpace(os.Getenv("DATABASE_URL"))
	if e.DatabaseURL == "" {
		missing = append(missing, "DATABASE_URL (e.g. postgres://idem:idem@127.0.0.1:5432/idem?sslmode=disable)")
	}
	if len(missing) > 0 {
		return env{}, usagef("environment variable not set: %s; start the services with `make services` and export what it prints (set -a; . .state/services.env; set +a)", strings.Join(missing, ", "))
	}
	return e, nil
}

// newLogger returns a text logger on w at level.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}
