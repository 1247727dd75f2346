// Package testenv gives tests a real Kafka broker and a real PostgreSQL database,
// chosen by environment, plus helpers that create unique topics, groups and
// schemas so tests can run in parallel.
//
// Kafka, in order of preference:
//  1. KAFKA_BROKERS (comma-separated), as set by `make services` or by the user;
//  2. testcontainers-go's kafka module, when a Docker engine answers;
//  3. an in-process franz-go kfake cluster, for quick local iteration only.
//
// CI always sets KAFKA_BROKERS (make test starts a real broker). Setting
// IDEM_REQUIRE_REAL_KAFKA=1 (CI does) turns the kfake fallback into a failure.
//
// PostgreSQL: DATABASE_URL if set; else testcontainers' postgres module when a
// Docker engine answers; else the test fails and tells the user to run
// `make services`. Integration tests never skip silently; with -short, callers
// may skip them through SkipIfShort.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
)

// Unique returns prefix followed by a random suffix, safe to use as a Kafka
// topic or group name and as a PostgreSQL identifier (lower case, [a-z0-9_]).
func Unique(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	p := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		default:
			return '_'
		}
	}, prefix)
	if len(p) > 40 {
		p = p[:40]
	}
	return p + "_" + hex.EncodeToString(b[:])
}

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
