package testkit_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/idemhq/idem/internal/testing/testkit"
)

// TestUniqueIsAValidNameForKafkaAndPostgres: both kits name topics, groups
// and schemas by this one rule.
func TestUniqueIsAValidNameForKafkaAndPostgres(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z0-9_]{1,40}_[0-9a-f]{12}$`)
	for _, prefix := range []string{"TestX/sub-case", "t_" + strings.Repeat("Long", 20), "orders.v1", "é"} {
		a, b := testkit.Unique(prefix), testkit.Unique(prefix)
		if !valid.MatchString(a) {
			t.Errorf("Unique(%q) = %q, want [a-z0-9_]{1,40}_<12 hex>", prefix, a)
		}
		if a == b {
			t.Errorf("Unique(%q) gave %q twice", prefix, a)
		}
	}
}

// TestWithSearchPathKeepsPoolSettings: a second pool on a test's schema keeps
// DATABASE_URL's pool_* settings, in both forms of connection string.
func TestWithSearchPathKeepsPoolSettings(t *testing.T) {
	for conn, want := range map[string]string{
		"postgres://u:p@h:5432/db?sslmode=disable&pool_max_conns=3": "postgres://u:p@h:5432/db?pool_max_conns=3&search_path=s_1&sslmode=disable",
		"host=h user=u pool_max_conns=3":                            "host=h user=u pool_max_conns=3 search_path=s_1",
	} {
		got, err := testkit.WithSearchPath(conn, "s_1")
		if err != nil || got != want {
			t.Errorf("WithSearchPath(%q) = %q, %v; want %q", conn, got, err, want)
		}
	}
}
