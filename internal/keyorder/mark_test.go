package keyorder_test

import (
	"context"
	"testing"

	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// markedDrain is the state a transactional drain of head m1 (read at offset
// 7 of src/0) leaves before its commit: m2 dead-lettered (DoneAt), m3
// promoted to head (PromoteAt), m4 still parked behind m3. m1's origin is
// at (nil: not known).
func markedDrain(t *testing.T, ctx context.Context, s *keyorder.Store, at *keyorder.Origin) *keyorder.Mark {
	t.Helper()
	m := &keyorder.Mark{Topic: "src", Partition: 0, Offset: 7, Head: "m1", HeadAt: at}
	block := keyorder.Origin{Partition: -1, Offset: -1}
	if at != nil {
		block = *at
	}
	if err := s.BlockAt(ctx, "t", []byte("K"), "m1", block, 0); err != nil {
		t.Fatal(err)
	}
	for i, ik := range []string{"m2", "m3", "m4"} {
		if st, err := s.Park(ctx, rec(ik, int64(i+2))); err != nil || st != keyorder.Blocked {
			t.Fatalf("Park(%s) = %v, %v", ik, st, err)
		}
	}
	next := func(head, want string) keyorder.Record {
		t.Helper()
		r, ok, err := s.Next(ctx, "t", []byte("K"), head)
		if err != nil || !ok || r.IdempotencyKey != want {
			t.Fatalf("Next(%s) = %s, %v, %v; want %s", head, r.IdempotencyKey, ok, err, want)
		}
		return r
	}
	if err := s.DoneAt(ctx, next("m1", "m2").Seq, m); err != nil {
		t.Fatal(err)
	}
	m3 := next("m1", "m3") // m2 is marked: skipped
	m3.Tier = 1
	if err := s.PromoteAt(ctx, "m1", m3, m); err != nil {
		t.Fatal(err)
	}
	if err := s.Forwarded(ctx, "t", []byte("K"), "m3"); err != nil {
		t.Fatal(err)
	}
	next("m3", "m4")
	if p, err := s.PendingOf(ctx, "t", 0); err != nil || len(p) != 0 {
		t.Fatalf("PendingOf lists a marked head: %+v, %v", p, err)
	}
	return m
}

// A transaction that committed (the mark's offset below the committed one):
// the marked rows go, the promoted head's pending forward is cleared, and m4
// stays parked behind m3. Marks of transactions still open are left alone.
func TestResolveCommitted(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	s := keyorder.New(testenv.Postgres(t), "g")
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	markedDrain(t, ctx, s, nil)
	// Copies of the marked messages read again before the commit settles
	// them: redeliveries, parked (skipped); only m3's copy from its tier is
	// the head.
	// (A copy carries its record's origin: m2's offset 2, m3's 3.)
	for _, c := range []struct {
		ikey     string
		origin   int64
		fromTier bool
		want     keyorder.State
	}{{"m2", 2, false, keyorder.Blocked}, {"m2", 2, true, keyorder.Blocked}, {"m3", 3, false, keyorder.Blocked}, {"m3", 3, true, keyorder.Head}} {
		if st, err := s.ParkCopy(ctx, rec(c.ikey, c.origin), keyorder.Copy{Topic: "src", Offset: 9, FromTier: c.fromTier}, true); err != nil || st != c.want {
			t.Fatalf("ParkCopy(%s, fromTier %v) = %v, %v; want %v", c.ikey, c.fromTier, st, err, c.want)
		}
	}
	if err := s.Resolve(ctx, []keyorder.Committed{{Topic: "src", Partition: 0, Offset: 7}}, false); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Parked(ctx); n != 3 {
		t.Fatalf("an open transaction's marks were settled: %d parked rows, want 3", n)
	}
	if err := s.Resolve(ctx, []keyorder.Committed{{Topic: "src", Partition: 1, Offset: 100}, {Topic: "src", Partition: 0, Offset: 8}}, false); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Parked(ctx); n != 1 {
		t.Fatalf("%d parked rows after the commit, want 1 (m4)", n)
	}
	if st, err := s.Park(ctx, rec("m3", 3)); err != nil || st != keyorder.Head {
		t.Fatalf("m3 back from its tier: %v, %v; want Head", st, err)
	}
	if p, err := s.Pending(ctx, []string{"t"}); err != nil || len(p) != 0 {
		t.Fatalf("pending after the commit: %+v, %v", p, err)
	}
}

// A transaction that did not commit, seen at claim: the head is m1 again and
// m2, m3, m4 are parked behind it in their order, so m1's redelivery drains
// them again. With the key unblocked meanwhile, the revert blocks it behind
// m1 again; with another head since, that head keeps the key.
func TestResolveRevertsAtClaim(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	db := testenv.Postgres(t)
	for _, tc := range []struct {
		name     string
		after    func(s *keyorder.Store)
		wantHead string
	}{
		{"promoted", func(*keyorder.Store) {}, "m1"},
		{"unblocked", func(s *keyorder.Store) {
			if _, err := db.Exec(ctx, `DELETE FROM idem_ordering_heads WHERE consumer_group=$1`, "g-unblocked"); err != nil {
				t.Fatal(err)
			}
		}, "m1"},
		{"another head", func(s *keyorder.Store) {
			if _, err := db.Exec(ctx, `DELETE FROM idem_ordering_heads WHERE consumer_group=$1`, "g-another head"); err != nil {
				t.Fatal(err)
			}
			if err := s.Block(ctx, "t", []byte("K"), "m9"); err != nil {
				t.Fatal(err)
			}
		}, "m9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := keyorder.New(db, "g-"+tc.name)
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			markedDrain(t, ctx, s, nil)
			tc.after(s)
			if st, err := s.ParkCopy(ctx, rec("m2", 2), keyorder.Copy{Topic: "t", Offset: 2}, true); err != nil || st != keyorder.Blocked {
				t.Fatalf("a redelivery of dead-lettered m2 before the claim's revert: %v, %v; want Blocked", st, err)
			}
			if err := s.Resolve(ctx, []keyorder.Committed{{Topic: "src", Partition: 0, Offset: 7}}, true); err != nil {
				t.Fatal(err)
			}
			if st, err := s.Park(ctx, rec(tc.wantHead, 1)); err != nil || st != keyorder.Head {
				t.Fatalf("Park(%s) = %v, %v; want it the head", tc.wantHead, st, err)
			}
			for _, want := range []string{"m2", "m3", "m4"} {
				r, ok, err := s.Next(ctx, "t", []byte("K"), tc.wantHead)
				if err != nil || !ok || r.IdempotencyKey != want {
					t.Fatalf("Next = %s, %v, %v; want %s", r.IdempotencyKey, ok, err, want)
				}
				if err := s.Done(ctx, r.Seq); err != nil {
					t.Fatal(err)
				}
			}
			if p, err := s.Pending(ctx, []string{"t"}); err != nil || len(p) != 0 {
				t.Fatalf("pending after the revert: %+v, %v", p, err)
			}
		})
	}
}

// A revert at claim restores the drain's head as one record: the record at
// the mark's HeadAt, whether the head row was promoted since (its
// revert_head) or removed (the key unblocked: the head comes back from the
// marked parked rows). A producer's duplicate of that head (its idempotency
// key at another offset) read after the revert is then parked behind it,
// not taken for it; before the parked rows carried the head's origin, the
// head an unblocked key got back was any record with m1's idempotency key.
func TestRevertRestoresTheHeadsOrigin(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	db := testenv.Postgres(t)
	for _, tc := range []struct {
		name  string
		after func(group string)
	}{
		{"promoted", func(string) {}},
		{"unblocked", func(group string) {
			if _, err := db.Exec(ctx, `DELETE FROM idem_ordering_heads WHERE consumer_group=$1`, group); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := "g-origin-" + tc.name
			s := keyorder.New(db, group)
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			markedDrain(t, ctx, s, &keyorder.Origin{Partition: 0, Offset: 1})
			tc.after(group)
			if err := s.Resolve(ctx, []keyorder.Committed{{Topic: "src", Partition: 0, Offset: 7}}, true); err != nil {
				t.Fatal(err)
			}
			if st, err := s.Park(ctx, rec("m1", 50)); err != nil || st != keyorder.Blocked {
				t.Fatalf("Park(a duplicate of head m1 at offset 50) = %v, %v; want Blocked (parked behind m1)", st, err)
			}
			if st, err := s.Park(ctx, rec("m1", 1)); err != nil || st != keyorder.Head {
				t.Fatalf("Park(m1 at its origin) = %v, %v; want Head", st, err)
			}
			for _, want := range []int64{2, 3, 4, 50} { // m2, m3, m4, then the duplicate
				r, ok, err := s.Next(ctx, "t", []byte("K"), "m1")
				if err != nil || !ok || r.Offset != want {
					t.Fatalf("Next = %s@%d, %v, %v; want offset %d", r.IdempotencyKey, r.Offset, ok, err, want)
				}
				if err := s.Done(ctx, r.Seq); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// With track, a parked row remembers the record that parked it until that
// record's offset is committed: drained before then, it stays (not drainable)
// and a redelivery of that record is skipped, not handled again.
func TestDrainedRowWaitsForItsParkingCommit(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	s := keyorder.New(testenv.Postgres(t), "g")
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Block(ctx, "t", []byte("K"), "m1"); err != nil {
		t.Fatal(err)
	}
	copyOf := keyorder.Copy{Topic: "t", Partition: 0, Offset: 2}
	if st, err := s.ParkCopy(ctx, rec("m2", 2), copyOf, true); err != nil || st != keyorder.Blocked {
		t.Fatalf("ParkCopy = %v, %v", st, err)
	}
	r, ok, err := s.Next(ctx, "t", []byte("K"), "m1")
	if err != nil || !ok {
		t.Fatalf("Next = %v, %v", ok, err)
	}
	m := &keyorder.Mark{Topic: "t.retry", Partition: 0, Offset: 5, Head: "m1"}
	if err := s.DoneAt(ctx, r.Seq, m); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Next(ctx, "t", []byte("K"), "m1"); ok || err != nil { // unblocks K
		t.Fatalf("Next after the drain = %v, %v", ok, err)
	}
	if err := s.Resolve(ctx, []keyorder.Committed{{Topic: "t.retry", Partition: 0, Offset: 6}}, false); err != nil {
		t.Fatal(err)
	}
	if st, err := s.ParkCopy(ctx, rec("m2", 2), copyOf, true); err != nil || st != keyorder.Blocked {
		t.Fatalf("a redelivery of the parking record of drained m2 = %v, %v; want Blocked (skipped)", st, err)
	}
	if n, _ := s.Parked(ctx); n != 0 {
		t.Fatalf("Parked counts %d drained rows", n)
	}
	if err := s.Resolve(ctx, []keyorder.Committed{{Topic: "t", Partition: 0, Offset: 3}}, false); err != nil {
		t.Fatal(err)
	}
	if st, err := s.ParkCopy(ctx, rec("m2", 2), keyorder.Copy{Topic: "t", Partition: 0, Offset: 9}, true); err != nil || st != keyorder.Free {
		t.Fatalf("m2 once its parking is committed = %v, %v; want Free (the row is gone)", st, err)
	}
}
