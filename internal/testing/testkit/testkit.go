// Package testkit is the one harness under idem's two test kits: the public
// idemtest, for users, and internal/testing/testenv, for idem's own tests (crash
// children, metric lookups, secure Kafka on top). It holds what both must do
// the same way: the unique-name rule, creating topics and waiting until they
// serve, deleting a test's topics (with the retry tiers and dead-letter
// topic idem made beside them) and groups when it ends, and a PostgreSQL
// schema per test. Errors are reported with the prefix "idemtest:", as
// users see them.
package testkit

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

// Unique returns prefix, lower-cased with every character outside
// [a-z0-9_] made "_" and cut to 40 characters, then "_" and 12 random hex
// digits: a valid Kafka topic or group name and PostgreSQL identifier.
func Unique(prefix string) string {
	p := []byte(strings.ToLower(prefix))
	for i, c := range p {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			p[i] = '_'
		}
	}
	if len(p) > 40 {
		p = p[:40]
	}
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return string(p) + "_" + hex.EncodeToString(b[:])
}

// Eventually calls f until it returns nil, waiting a little longer each
// time (5ms doubling up to 200ms), and fails the test with f's last error
// once timeout has passed.
func Eventually(tb testing.TB, timeout time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	wait := 5 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("idemtest: gave up after %s: %v", timeout, err)
		}
		time.Sleep(wait) // the polling interval, not synchronisation
		wait = min(2*wait, 200*time.Millisecond)
	}
}
