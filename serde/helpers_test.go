package serde_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/idemhq/idem/serde"
)

// registryURL is the schema registry the tests run against: the real one
// `make services` starts (SCHEMA_REGISTRY_URL), or, when it is not set and
// IDEM_REQUIRE_REAL_KAFKA is not 1, franz-go's in-process fake (srfake),
// which is never the only registry the tests meet: `make test` and CI set
// both variables.
func registryURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("SCHEMA_REGISTRY_URL"); u != "" {
		return u
	}
	if os.Getenv("IDEM_REQUIRE_REAL_KAFKA") == "1" {
		t.Fatal("SCHEMA_REGISTRY_URL is not set: `make services` starts a schema registry; export .state/services.env (set -a; . .state/services.env; set +a)")
	}
	fake := srfake.New()
	t.Cleanup(fake.Close)
	return fake.URL()
}

// newRegistry returns a Registry on registryURL with the tests' settings.
func newRegistry(t testing.TB, url string) *serde.Registry {
	t.Helper()
	reg, err := serde.NewRegistry(serde.RegistryConfig{URL: url, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

var nonWord = regexp.MustCompile(`[^A-Za-z0-9]+`)

// subject returns a subject name of the test's own, deleted (soft, then
// hard) when the test ends.
func subject(t testing.TB, url, what string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	s := strings.ToLower(nonWord.ReplaceAllString(t.Name(), "-")) + "-" + what + "-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		cl, err := sr.NewClient(sr.URLs(url))
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = cl.DeleteSubject(ctx, s, sr.SoftDelete)
		_, _ = cl.DeleteSubject(ctx, s, sr.HardDelete)
	})
	return s
}

func ctxOf(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
