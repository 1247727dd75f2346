// Command payments-consumer is idem's reference service: it consumes payment
// events from Kafka and records them in PostgreSQL so that every retry is
// safe — a payment delivered twice is stored once and charges its order once.
//
// Usage:
//
//	payments-consumer [-topic payments] [-group payments-consumer] [-partitions 6] [-metrics-addr :9464] [-bank-failure-rate 0] [-bank-outage 4s+3s] …
//	payments-consumer demo [-n 10000] [-dup 0.10] [-bad 20] [-rate 1000] [-timeout 5m] [bank flags]
//
// Both read KAFKA_BROKERS (comma-separated host:port) and DATABASE_URL from
// the environment (`make services` prints them). See README.md.
package main

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
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
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

// usageError marks errors the user fixes on the command line or in the
// environment (exit status 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// run dispatches to the consumer (the default) or the demo subcommand.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "demo" {
		return demoMain(ctx, args[1:], stdout, stderr)
	}
	return serveMain(ctx, args, stderr)
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
