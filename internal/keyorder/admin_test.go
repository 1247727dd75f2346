package keyorder_test

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/pgmigrate"
	"github.com/idemhq/idem/internal/testing/testenv"
)

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
