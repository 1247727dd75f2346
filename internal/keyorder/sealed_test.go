package keyorder_test

import (
	"testing"
	"time"

	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestSealedStore: with a sealer, a parked message and a promoted head's
// pending forward are sealed at rest (no plaintext in their rows) and read
// back intact; once the data key is destroyed, Next and PendingOf return
// them with Unreadable set and no payload, and a store without the key
// fails (the row waits), never returning an empty payload as if it were
// the message's.
func TestSealedStore(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	db := testenv.Postgres(t)
	if err := seal.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	kek, err := seal.RandomKEK()
	if err != nil {
		t.Fatal(err)
	}
	sl, err := seal.New(ctx, seal.Config{DB: db, KEKs: []seal.KEK{kek}, Purpose: keyorder.Purpose, CacheTTL: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	plain := keyorder.New(db, "g")
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s := plain.Sealed(sl)
	secret := func(ikey string, off int64) keyorder.Record {
		r := rec(ikey, off)
		r.Value = []byte("card 4111111111111111 " + ikey)
		return r
	}
	if st, err := s.Park(ctx, secret("m1", 1)); err != nil || st != keyorder.Free {
		t.Fatalf("Park(m1) = %v, %v", st, err)
	}
	if err := s.Block(ctx, "t", []byte("K"), "m1"); err != nil {
		t.Fatal(err)
	}
	for i, ik := range []string{"m2", "m3"} {
		if st, err := s.Park(ctx, secret(ik, int64(i+2))); err != nil || st != keyorder.Blocked {
			t.Fatalf("Park(%s) = %v, %v", ik, st, err)
		}
	}
	count := func(q string) int {
		t.Helper()
		var n int
		if err := db.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(`SELECT count(*) FROM idem_ordering_parked WHERE key_id IS NOT NULL AND value IS NULL
		AND cardinality(header_values) = 0 AND position('4111111111111111'::bytea IN sealed) = 0`); n != 2 {
		t.Fatalf("%d of 2 parked rows sealed at rest", n)
	}
	next, ok, err := s.Next(ctx, "t", []byte("K"), "m1")
	if err != nil || !ok || string(next.Value) != "card 4111111111111111 m2" || len(next.Headers) != 1 || next.Unreadable != nil {
		t.Fatalf("Next = %+v, %v, %v; want m2 with its payload", next, ok, err)
	}
	next.Tier, next.Error = 1, "failed on card 4111111111111111"
	if err := s.Promote(ctx, "m1", next); err != nil {
		t.Fatal(err)
	}
	if n := count(`SELECT count(*) FROM idem_ordering_heads WHERE position('4111111111111111' IN pending::text) = 0
		AND pending->>'key_id' IS NOT NULL AND pending->'value' = 'null'::jsonb`); n != 1 {
		var p string
		_ = db.QueryRow(ctx, `SELECT pending::text FROM idem_ordering_heads`).Scan(&p)
		t.Fatalf("the pending forward is not sealed at rest: %s", p)
	}
	pending, err := s.PendingOf(ctx, "t", 0)
	if err != nil || len(pending) != 1 || string(pending[0].Value) != "card 4111111111111111 m2" || pending[0].Unreadable != nil {
		t.Fatalf("PendingOf = %+v, %v; want m2 with its payload", pending, err)
	}
	if _, err := plain.PendingOf(ctx, "t", 0); err == nil {
		t.Fatal("a store without the key read a sealed pending forward")
	}

	var id int64
	if err := db.QueryRow(ctx, `SELECT key_id FROM idem_seal_keys WHERE purpose = $1`, keyorder.Purpose).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if err := seal.Destroy(ctx, db, id, "test", "erasure"); err != nil {
		t.Fatal(err)
	}
	pending, err = s.PendingOf(ctx, "t", 0)
	if err != nil || len(pending) != 1 || pending[0].Unreadable == nil || pending[0].Value != nil || pending[0].IdempotencyKey != "m2" {
		t.Fatalf("PendingOf after the key was destroyed = %+v, %v; want m2 unreadable", pending, err)
	}
	if err := s.Forwarded(ctx, "t", []byte("K"), "m2"); err != nil {
		t.Fatal(err)
	}
	next, ok, err = s.Next(ctx, "t", []byte("K"), "m2")
	if err != nil || !ok || next.IdempotencyKey != "m3" || next.Unreadable == nil || next.Value != nil || len(next.Headers) != 0 {
		t.Fatalf("Next after the key was destroyed = %+v, %v, %v; want m3 unreadable", next, ok, err)
	}
}
