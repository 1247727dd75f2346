// Package sealtest is the tests' help with payload encryption at rest: a
// key-encryption key to give an owner, and the destruction of a purpose's
// data keys once no sealer can still hold them.
package sealtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// KEK returns a new key-encryption key as text, what a service reads from
// its key file or IDEM_ENCRYPTION_KEY (the EncryptionKey fields).
func KEK(tb testing.TB) string {
	tb.Helper()
	text, _, err := seal.GenerateKEK()
	if err != nil {
		tb.Fatal(err)
	}
	return text
}

// DestroyKeys destroys every live data key of purpose in db (`idem
// keys destroy`), once no sealer can still hold one in its cache
// (internal/seal's CacheTTL, 1 s): it first waits until the newest key,
// and the time newest (a SQL expression, e.g. the newest row sealed under
// it; "" for none) gives, are over two seconds old.
func DestroyKeys(tb testing.TB, db seal.DB, purpose, newest string) {
	tb.Helper()
	ctx := context.Background()
	if newest == "" {
		newest = "SELECT NULL::timestamptz"
	}
	testenv.Eventually(tb, 30*time.Second, func() error {
		var young bool
		if err := db.QueryRow(ctx, `SELECT coalesce((SELECT max(created_at) FROM idem_seal_keys WHERE purpose = $1), now())
				> now() - interval '2 seconds' OR coalesce((`+newest+`) > now() - interval '2 seconds', false)`, purpose).Scan(&young); err != nil {
			return err
		}
		if young {
			return fmt.Errorf("the %s key or its newest row is under 2 s old", purpose)
		}
		return nil
	})
	rows, err := db.Query(ctx, `SELECT key_id FROM idem_seal_keys WHERE purpose = $1 AND destroyed_at IS NULL`, purpose)
	if err != nil {
		tb.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			tb.Fatal(err)
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		tb.Fatalf("no live %s key to destroy", purpose)
	}
	for _, id := range ids {
		if err := seal.Destroy(ctx, db, id, "test", "erasure request"); err != nil {
			tb.Fatal(err)
		}
	}
}
