package keyorder_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/testing/testenv"
)

func rec(ikey string, off int64) keyorder.Record {
	return keyorder.Record{Topic: "t", Key: []byte("K"), IdempotencyKey: ikey, Partition: 0, Offset: off,
		Timestamp: time.UnixMilli(1_700_000_000_000 + off).UTC(), Value: []byte(ikey),
		Headers: []keyorder.Header{{Key: "idempotency-key", Value: []byte(ikey)}}}
}

// The life of a blocked key: park behind the head in arrival order, drain,
// promote a failing parked message with a pending forward, recover it, unblock.
func TestKeyLifecycle(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	s := keyorder.New(testenv.Postgres(t), "g")
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	state := func(r keyorder.Record, want keyorder.State) {
		t.Helper()
		got, err := s.Park(ctx, r)
		if err != nil || got != want {
			t.Fatalf("Park(%s) = %v, %v; want %v", r.IdempotencyKey, got, err, want)
		}
	}
	state(rec("m1", 1), keyorder.Free)
	if err := s.Block(ctx, "t", []byte("K"), "m1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Block(ctx, "t", []byte("K"), "m1"); err != nil {
		t.Fatalf("Block is not idempotent: %v", err)
	}
	if err := s.Block(ctx, "t", []byte("K"), "other"); !errors.Is(err, keyorder.ErrOtherHead) {
		t.Fatalf("Block by another message = %v, want ErrOtherHead", err)
	}
	state(rec("m1", 1), keyorder.Head)
	state(rec("m2", 2), keyorder.Blocked)
	state(rec("m3", 3), keyorder.Blocked)
	state(rec("m2", 2), keyorder.Blocked) // a redelivery: parked once
	if n, _ := s.Parked(ctx); n != 2 {
		t.Fatalf("parked %d, want 2", n)
	}
	if _, ok, err := s.Next(ctx, "t", []byte("K"), "not-the-head"); ok || err != nil {
		t.Fatalf("Next by a non-head = %v, %v", ok, err)
	}
	next, ok, err := s.Next(ctx, "t", []byte("K"), "m1")
	if err != nil || !ok || next.IdempotencyKey != "m2" || string(next.Value) != "m2" || len(next.Headers) != 1 || !next.Timestamp.Equal(rec("m2", 2).Timestamp) {
		t.Fatalf("Next = %+v, %v, %v; want m2 with its payload", next, ok, err)
	}
	// m2 fails: it becomes the head, its forward pending.
	next.Tier = 1
	if err := s.Promote(ctx, "m1", next); err != nil {
		t.Fatal(err)
	}
	pending, err := s.Pending(ctx, []string{"t"})
	if err != nil || len(pending) != 1 || pending[0].IdempotencyKey != "m2" || pending[0].Tier != 1 {
		t.Fatalf("Pending = %+v, %v", pending, err)
	}
	if err := s.Forwarded(ctx, "t", []byte("K"), "m2"); err != nil {
		t.Fatal(err)
	}
	if pending, _ := s.Pending(ctx, []string{"t"}); len(pending) != 0 {
		t.Fatalf("pending after Forwarded: %+v", pending)
	}
	state(rec("m2", 2), keyorder.Head)
	state(rec("m4", 4), keyorder.Blocked)
	// m2 succeeds: m3 then m4 follow, then the key is free.
	for _, want := range []string{"m3", "m4"} {
		next, ok, err := s.Next(ctx, "t", []byte("K"), "m2")
		if err != nil || !ok || next.IdempotencyKey != want {
			t.Fatalf("Next = %+v, %v, %v; want %s", next, ok, err, want)
		}
		if err := s.Done(ctx, next.Seq); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := s.Next(ctx, "t", []byte("K"), "m2"); ok || err != nil {
		t.Fatalf("Next on an empty queue = %v, %v", ok, err)
	}
	state(rec("m5", 5), keyorder.Free)
}

// The head is one record: a producer's duplicate of the head (its
// idempotency key at another offset) is parked behind it and drained after
// the records parked before it, not taken for the head; the head's own
// source copy, read again, is still the head, even with the duplicate's row
// in place (else a head whose forward aborted would be skipped, and its key
// blocked for ever). A head whose origin is not known (Block) is any record
// with its idempotency key, as before.
func TestHeadIsOneRecord(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	s := keyorder.New(testenv.Postgres(t), "g")
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	src := func(r keyorder.Record) keyorder.Copy {
		return keyorder.Copy{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
	}
	state := func(r keyorder.Record, c keyorder.Copy, want keyorder.State) {
		t.Helper()
		got, err := s.ParkCopy(ctx, r, c, true)
		if err != nil || got != want {
			t.Fatalf("ParkCopy(%s@%d from %s) = %v, %v; want %v", r.IdempotencyKey, r.Offset, c.Topic, got, err, want)
		}
	}
	h, p, d := rec("h", 0), rec("p", 1), rec("h", 2)
	if err := s.BlockAt(ctx, "t", []byte("K"), "h", keyorder.Origin{Partition: 0, Offset: 0}, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.BlockAt(ctx, "t", []byte("K"), "h", keyorder.Origin{Partition: 0, Offset: 2}, 1); !errors.Is(err, keyorder.ErrOtherHead) {
		t.Fatalf("BlockAt by the head's duplicate = %v, want ErrOtherHead", err)
	}
	state(p, src(p), keyorder.Blocked)
	state(d, src(d), keyorder.Blocked)
	state(d, src(d), keyorder.Blocked) // its redelivery: parked once
	state(h, src(h), keyorder.Head)    // the head's own source copy, read again
	state(h, keyorder.Copy{Topic: "t.retry.1", Partition: 0, Offset: 9, FromTier: true}, keyorder.Head)
	state(d, keyorder.Copy{Topic: "t.retry.1", Partition: 0, Offset: 10, FromTier: true}, keyorder.Blocked) // the duplicate's own tier copy
	if n, _ := s.Parked(ctx); n != 2 {
		t.Fatalf("parked %d, want 2 (p, then h's duplicate)", n)
	}
	for _, want := range []keyorder.Record{p, d} {
		next, ok, err := s.Next(ctx, "t", []byte("K"), "h")
		if err != nil || !ok || next.IdempotencyKey != want.IdempotencyKey || next.Offset != want.Offset {
			t.Fatalf("Next = %+v, %v, %v; want %s@%d", next, ok, err, want.IdempotencyKey, want.Offset)
		}
		if err := s.Done(ctx, next.Seq); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := s.Next(ctx, "t", []byte("K"), "h"); ok || err != nil {
		t.Fatalf("Next after the drain = %v, %v; want the key unblocked", ok, err)
	}
	// A head of unknown origin: any record with its idempotency key.
	if err := s.Block(ctx, "t", []byte("K"), "h"); err != nil {
		t.Fatal(err)
	}
	state(d, src(d), keyorder.Head)
}
