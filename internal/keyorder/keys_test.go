package keyorder_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/testing/testenv"
)

func newStore(t *testing.T, group string) (*keyorder.Store, context.Context, keyorder.DB) {
	t.Helper()
	ctx := testenv.Context(t)
	db := testenv.Postgres(t)
	s := keyorder.New(db, group)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s, ctx, db
}

// A Kafka key of 8 KiB of random bytes (too large for a btree entry, and
// incompressible) blocks, parks, drains and promotes like any other: the
// indexes use its digest, and the full key comes back.
func TestLongKey(t *testing.T) {
	t.Parallel()
	s, ctx, db := newStore(t, "g")
	key := make([]byte, 8<<10)
	_, _ = rand.Read(key)
	r := func(ikey string, off int64) keyorder.Record {
		x := rec(ikey, off)
		x.Key = key
		return x
	}
	if st, err := s.Park(ctx, r("m1", 1)); err != nil || st != keyorder.Free {
		t.Fatalf("Park = %v, %v", st, err)
	}
	if err := s.BlockTier(ctx, "t", key, "m1", 1); err != nil {
		t.Fatal(err)
	}
	for i, ik := range []string{"m2", "m3"} {
		if st, err := s.Park(ctx, r(ik, int64(i+2))); err != nil || st != keyorder.Blocked {
			t.Fatalf("Park(%s) = %v, %v", ik, st, err)
		}
	}
	other := append(bytes.Clone(key[:len(key)-1]), key[len(key)-1]^1) // differs in the last byte only
	if st, err := s.Park(ctx, keyorder.Record{Topic: "t", Key: other, IdempotencyKey: "x", Timestamp: time.Now()}); err != nil || st != keyorder.Free {
		t.Fatalf("a different long key is blocked too: %v, %v", st, err)
	}
	next, ok, err := s.Next(ctx, "t", key, "m1")
	if err != nil || !ok || next.IdempotencyKey != "m2" || !bytes.Equal(next.Key, key) {
		t.Fatalf("Next = %v, %v, %v", next.IdempotencyKey, ok, err)
	}
	next.Tier = 1
	if err := s.Promote(ctx, "m1", next); err != nil {
		t.Fatal(err)
	}
	p, err := s.PendingOf(ctx, "t", 0)
	if err != nil || len(p) != 1 || !bytes.Equal(p[0].Key, key) {
		t.Fatalf("PendingOf = %d records, %v", len(p), err)
	}
	if err := s.Forwarded(ctx, "t", key, "m2"); err != nil {
		t.Fatal(err)
	}
	keys, err := keyorder.List(ctx, db, "g", "t")
	if err != nil || len(keys) != 1 || !bytes.Equal(keys[0].Key, key) || keys[0].Head != "m2" || keys[0].Parked != 1 || keys[0].Tier != 1 {
		t.Fatalf("List = %+v, %v", keys, err)
	}
}

// Header names and values come back from a parked row byte for byte: a name
// that is not UTF-8, one holding a NUL, an empty name, a null value and an
// empty one; and so do they from a pending forward.
func TestHeaderBytesRoundTrip(t *testing.T) {
	t.Parallel()
	s, ctx, _ := newStore(t, "g")
	hs := []keyorder.Header{
		{Key: "\xff\xfe", Value: []byte("not utf-8 name")},
		{Key: "a\x00b", Value: []byte{0, 1, 0}},
		{Key: "", Value: []byte("empty name")},
		{Key: "null", Value: nil},
		{Key: "empty", Value: []byte{}},
		{Key: "caf\xc3\xa9", Value: []byte("é")},
	}
	if err := s.Block(ctx, "t", []byte("K"), "h"); err != nil {
		t.Fatal(err)
	}
	in := keyorder.Record{Topic: "t", Key: []byte("K"), IdempotencyKey: "m", Offset: 4,
		Timestamp: time.UnixMilli(1_700_000_000_123).UTC(), Value: []byte{}, Headers: hs}
	if st, err := s.Park(ctx, in); err != nil || st != keyorder.Blocked {
		t.Fatalf("Park = %v, %v", st, err)
	}
	got, ok, err := s.Next(ctx, "t", []byte("K"), "h")
	if err != nil || !ok {
		t.Fatalf("Next = %v, %v", ok, err)
	}
	sameHeaders(t, "parked", got.Headers, hs)
	if got.Value == nil || len(got.Value) != 0 {
		t.Fatalf("empty value came back as %#v", got.Value)
	}
	if err := s.Promote(ctx, "h", got); err != nil {
		t.Fatal(err)
	}
	p, err := s.PendingOf(ctx, "t", 0)
	if err != nil || len(p) != 1 {
		t.Fatalf("PendingOf = %+v, %v", p, err)
	}
	sameHeaders(t, "pending", p[0].Headers, hs)
}

func sameHeaders(t *testing.T, via string, got, want []keyorder.Header) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d headers, want %d", via, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Key != w.Key || (g.Value == nil) != (w.Value == nil) || !bytes.Equal(g.Value, w.Value) {
			t.Fatalf("%s: header %d = %q:%#v, want %q:%#v", via, i, g.Key, g.Value, w.Key, w.Value)
		}
	}
}
