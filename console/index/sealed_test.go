package index

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestRunRefusesABadEncryptionKey: Run returns at once, rather than retry
// for ever, for a key file others may read (without reading it), for
// EncryptionKeyFile and EncryptionKey both set, and for a key that does not
// unwrap the index's data keys (naming both KEK ids).
func TestRunRefusesABadEncryptionKey(t *testing.T) {
	pool, _ := testenv.PostgresSchema(t)
	ctx := testenv.Context(t)
	if err := seal.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	theKey, err := seal.RandomKEK()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seal.Roll(ctx, pool, theKey, failidx.Purpose); err != nil {
		t.Fatal(err)
	}
	other, _, err := seal.GenerateKEK()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "kek")
	if err := os.WriteFile(file, []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	base := Indexer{Brokers: []string{"127.0.0.1:1"}, Pool: pool, Topics: []string{"t.dlq"}}
	for _, c := range []struct {
		name string
		mut  func(*Indexer)
		want string
	}{
		{"world-readable file", func(ix *Indexer) { ix.EncryptionKeyFile = file }, "chmod 600"},
		{"file and key", func(ix *Indexer) { ix.EncryptionKeyFile, ix.EncryptionKey = file, other }, "both set"},
		{"another key", func(ix *Indexer) { ix.EncryptionKey = other }, theKey.ID()},
	} {
		ix := base
		c.mut(&ix)
		start := time.Now()
		err := ix.Run(ctx)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), other) || time.Since(start) > 30*time.Second {
			t.Errorf("%s: Run = %v after %v, want an error saying %q at once (and never the key)", c.name, err, time.Since(start), c.want)
		}
		if c.name == "another key" && !errors.Is(err, seal.ErrWrongKEK) {
			t.Errorf("%s: %v, want seal.ErrWrongKEK", c.name, err)
		}
	}
}
