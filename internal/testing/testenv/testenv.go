// Package testenv is what idem's own tests need beyond the public test kit
// idemtest: crash children (StartChild), metric lookups (Metric), a secure
// broker (NewSecureKafka), free ports, an idempotent producer, and a Docker
// fallback when no service is running. Tests that idemtest can serve use
// idemtest; the Kafka, PostgreSQL, unique-name and clean-up helpers here are
// thin wrappers over the same harness (internal/testing/testkit), so there is one
// rule for each.
//
// Kafka, in order of preference:
//  1. KAFKA_BROKERS (comma-separated), as set by `make services` or by the user;
//  2. testcontainers-go's kafka module, when KAFKA_BROKERS is not set and a
//     Docker engine answers;
//  3. an in-process franz-go kfake cluster, one per test binary, for quick
//     local iteration only.
//
// 1 and 3 are idemtest.Connect's choice, made in one place
// (testkit.Connect). testenv does not import idemtest: idemtest imports
// consumer and the packages under it, whose in-package tests use testenv. CI always sets KAFKA_BROKERS (make
// test starts a real broker). Setting IDEM_REQUIRE_REAL_KAFKA=1 (CI does)
// turns the kfake fallback into a failure.
//
// PostgreSQL: DATABASE_URL if set; else testcontainers' postgres module when a
// Docker engine answers; else the test fails and tells the user to run
// `make services`. Integration tests never skip silently; with -short, callers
// may skip them through SkipIfShort.
package testenv

import (
	"context"
	"testing"

	"github.com/idemhq/idem/internal/testing/testkit"
)

// Unique returns prefix followed by a random suffix, safe to use as a Kafka
// topic or group name and as a PostgreSQL identifier (lower case, [a-z0-9_]):
// the rule idemtest's names follow.
func Unique(prefix string) string { return testkit.Unique(prefix) }

// SkipIfShort skips an integration test when `go test -short` is used. It is
// the only way an integration test may skip.
func SkipIfShort(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("integration test: skipped with -short")
	}
}

// Context returns a context cancelled when the test ends.
func Context(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	return ctx
}
