package payments

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"
)

// A start-up step that meets an outage is tried again until it succeeds; one
// that fails for a reason no wait mends is not.
func TestRetryStartRidesOutOutagesOnly(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	tries := 0
	err := retryStart(t.Context(), log, "flaky", func(context.Context) error {
		if tries++; tries < 3 {
			return &pgconn.PgError{Code: "57P03", Message: "the database system is starting up"}
		}
		return nil
	})
	if err != nil || tries != 3 {
		t.Fatalf("outage twice then up: err %v after %d tries; want nil after 3", err, tries)
	}
	if n := strings.Count(logs.String(), "retrying"); n != 2 {
		t.Fatalf("%d retry warnings, want 2:\n%s", n, logs.String())
	}

	tries = 0
	login := &pgconn.PgError{Code: "28P01", Message: "password authentication failed"}
	err = retryStart(t.Context(), log, "login", func(context.Context) error { tries++; return login })
	if !errors.Is(err, login) || tries != 1 {
		t.Fatalf("refused login: err %v after %d tries; want it at once", err, tries)
	}
}

// What the service's own start-up steps return when nothing listens is an
// outage, for PostgreSQL and for Kafka; a refused login to the real
// PostgreSQL is not.
func TestOutageClassifiesRealErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there now

	_, err = openDB(t.Context(), "postgres://idem:idem@"+closed+"/idem?sslmode=disable&connect_timeout=5")
	if err == nil || !outage(err) {
		t.Fatalf("PostgreSQL not listening: %v; want an outage", err)
	}
	scfg := saramaConfig("startup-test")
	scfg.Metadata.Retry.Max = 0
	err = createTopic(t.Context(), []string{closed}, scfg, "t", 1, slog.New(slog.DiscardHandler))
	if err == nil || !outage(err) || !errors.Is(err, sarama.ErrOutOfBrokers) {
		t.Fatalf("Kafka not listening: %v; want an outage", err)
	}

	e := servicesEnv(t)
	u, err := url.Parse(e.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "not-the-password")
	_, err = openDB(t.Context(), u.String())
	if err == nil || outage(err) {
		t.Fatalf("wrong password: %v; want an error that is not an outage", err)
	}
}
