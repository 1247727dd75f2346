package keyorder_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/pgmigrate"
	"github.com/idemhq/idem/internal/testenv"
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

// Two workers handling one key at once: of two Blocks by different messages,
// and of two Promotes of the same parked message, exactly one wins and the
// other gets ErrOtherHead; nothing is left half done.
func TestConcurrentHeadsOneWins(t *testing.T) {
	t.Parallel()
	s, ctx, _ := newStore(t, "g")
	for round := range 10 {
		key := []byte(fmt.Sprint("K", round))
		errs := race(func(i int) error { return s.Block(ctx, "t", key, fmt.Sprint("m", i)) })
		if won, lost := outcomes(t, errs); won != 1 || lost != 1 {
			t.Fatalf("round %d: Block: %d won, %d lost: %v", round, won, lost, errs)
		}
	}
	// Two drains of head h both read parked m2 and both try to promote it.
	if err := s.Block(ctx, "t", []byte("P"), "h"); err != nil {
		t.Fatal(err)
	}
	r := rec("m2", 2)
	r.Key = []byte("P")
	if st, err := s.Park(ctx, r); err != nil || st != keyorder.Blocked {
		t.Fatalf("Park = %v, %v", st, err)
	}
	next, _, err := s.Next(ctx, "t", []byte("P"), "h")
	if err != nil {
		t.Fatal(err)
	}
	next.Tier = 1
	errs := race(func(int) error { return s.Promote(ctx, "h", next) })
	if won, lost := outcomes(t, errs); won != 1 || lost != 1 {
		t.Fatalf("Promote: %d won, %d lost: %v", won, lost, errs)
	}
	if p, err := s.PendingOf(ctx, "t", 0); err != nil || len(p) != 1 || p[0].IdempotencyKey != "m2" {
		t.Fatalf("PendingOf = %+v, %v", p, err)
	}
}

// race runs f(0) and f(1) at once and returns their errors.
func race(f func(i int) error) []error {
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range errs {
		wg.Go(func() {
			<-start
			errs[i] = f(i)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

func outcomes(t *testing.T, errs []error) (won, lost int) {
	t.Helper()
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case errors.Is(err, keyorder.ErrOtherHead):
			lost++
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	return won, lost
}

// List reports blocked keys per group and topic; Release hands a key's
// pending head and then its parked messages to send, in order, and removes
// them; a failing send removes nothing.
func TestListAndRelease(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	db := testenv.Postgres(t)
	a, b := keyorder.New(db, "ga"), keyorder.New(db, "gb")
	if err := a.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	park := func(s *keyorder.Store, key, ikey string, off int64) {
		t.Helper()
		r := rec(ikey, off)
		r.Key = []byte(key)
		if st, err := s.Park(ctx, r); err != nil || st != keyorder.Blocked {
			t.Fatalf("Park(%s) = %v, %v", ikey, st, err)
		}
	}
	for _, s := range []*keyorder.Store{a, b} {
		for _, k := range []string{"K", "L"} {
			if err := s.BlockTier(ctx, "t", []byte(k), k+"0", 2); err != nil {
				t.Fatal(err)
			}
		}
	}
	park(a, "K", "K1", 1)
	park(a, "K", "K2", 2)
	park(a, "K", "K3", 3)
	park(a, "L", "L1", 4)
	park(b, "K", "K1", 1)
	// K's first parked message was promoted and its forward is pending.
	next, _, err := a.Next(ctx, "t", []byte("K"), "K0")
	if err != nil {
		t.Fatal(err)
	}
	next.Tier = 1
	if err := a.Promote(ctx, "K0", next); err != nil {
		t.Fatal(err)
	}

	all, err := keyorder.List(ctx, db, "", "")
	if err != nil || len(all) != 4 {
		t.Fatalf("List all = %+v, %v", all, err)
	}
	ga, err := keyorder.List(ctx, db, "ga", "t")
	if err != nil || len(ga) != 2 {
		t.Fatalf("List ga = %+v, %v", ga, err)
	}
	if k := ga[0]; string(k.Key) != "K" || k.Head != "K1" || !k.Pending || k.Parked != 2 || k.Tier != 1 || k.OldestParked.IsZero() {
		t.Fatalf("List ga[0] = %+v", k)
	}
	if l := ga[1]; string(l.Key) != "L" || l.Head != "L0" || l.Pending || l.Parked != 1 || l.Tier != 2 {
		t.Fatalf("List ga[1] = %+v", l)
	}

	boom := errors.New("broker down")
	n, err := a.Release(ctx, "t", []byte("K"), func(r keyorder.Record) error {
		if r.IdempotencyKey == "K2" {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || n != 1 {
		t.Fatalf("failing Release = %d, %v", n, err)
	}
	if again, _ := keyorder.List(ctx, db, "ga", "t"); len(again) != 2 || again[0].Parked != 2 || !again[0].Pending {
		t.Fatalf("a failed Release changed the rows: %+v", again)
	}
	var sent []string
	n, err = a.Release(ctx, "t", []byte("K"), func(r keyorder.Record) error {
		sent = append(sent, r.IdempotencyKey)
		return nil
	})
	if err != nil || n != 3 || fmt.Sprint(sent) != "[K1 K2 K3]" {
		t.Fatalf("Release = %d %v, %v; want the pending K1, then K2, K3", n, sent, err)
	}
	if left, _ := keyorder.List(ctx, db, "ga", ""); len(left) != 1 || string(left[0].Key) != "L" {
		t.Fatalf("after Release: %+v", left)
	}
	if st, err := a.Park(ctx, keyorder.Record{Topic: "t", Key: []byte("K"), IdempotencyKey: "K9", Timestamp: time.Now()}); err != nil || st != keyorder.Free {
		t.Fatalf("K after Release: %v, %v", st, err)
	}
	if other, _ := keyorder.List(ctx, db, "gb", ""); len(other) != 2 {
		t.Fatalf("Release touched another group: %+v", other)
	}
}

// Rows parked by the first schema (headers as jsonb, keys indexed whole)
// come back unchanged after Migrate upgrades the tables.
func TestMigrateKeepsParkedRows(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	db := testenv.Postgres(t)
	ms, err := pgmigrate.Load(os.DirFS("."), "migrations", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgmigrate.Apply(ctx, db, "ordering", ms[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO idem_ordering_heads(consumer_group, topic, msg_key, head_key) VALUES ('g','t','K','h')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO idem_ordering_parked(consumer_group, topic, msg_key, idempotency_key, "partition", "offset", record_time, value, headers)
		VALUES ('g','t','K','m',0,2,now(),'v','[{"k":"idempotency-key","v":"bQ=="},{"k":"n","v":null},{"k":"e","v":""}]')`); err != nil {
		t.Fatal(err)
	}
	s := keyorder.New(db, "g")
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Next(ctx, "t", []byte("K"), "h")
	if err != nil || !ok || got.IdempotencyKey != "m" {
		t.Fatalf("Next = %+v, %v, %v", got, ok, err)
	}
	sameHeaders(t, "migrated", got.Headers, []keyorder.Header{{Key: "idempotency-key", Value: []byte("m")}, {Key: "n"}, {Key: "e", Value: []byte{}}})
}
