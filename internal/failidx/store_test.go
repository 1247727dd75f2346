package failidx

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

func TestMigrateIsIdempotent(t *testing.T) {
	pool, _ := failidxtest.NewPool(t)
	for range 2 {
		if err := tables.MigrateIndex(testenv.Context(t), pool); err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range []string{"idem_dlq_records", "idem_dlq_versions", "idem_dlq_audit"} {
		if n := failidxtest.Count(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename = $1 AND schemaname = current_schema()`, table); n != 1 {
			t.Errorf("table %s: %d", table, n)
		}
	}
}

// TestStoreListGroupsFilters indexes records directly and reads them back
// through every filter, the cursor paging and the groups.
func TestStoreListGroupsFilters(t *testing.T) {
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	s := NewStore(pool)
	base := time.Now().Add(-2 * time.Hour).Truncate(time.Millisecond)
	var ds []dead
	for i := range 30 {
		d := dead{Topic: "orders.billing.dlq", Origin: "orders", Key: fmt.Sprint("order-", i), Value: []byte(fmt.Sprintf(`{"id":"order-%d"}`, i)),
			Kind: handler.KindTimeout, Err: fmt.Sprintf("call ledger for order %d: deadline exceeded", i), LastFailed: base.Add(time.Duration(i) * time.Minute)}
		if i%3 == 0 {
			d.Kind, d.Err = handler.KindDecode, fmt.Sprintf("decode: invalid character at offset %d", i)
		}
		if i >= 25 {
			d.Topic, d.Origin, d.Group = "payments.ledger.dlq", "payments", "ledger"
		}
		ds = append(ds, d)
	}
	ds = append(ds, dead{Topic: "orders.billing.dlq", Origin: "orders", Key: "kafka-key", Derived: "derived-key", Value: []byte("x"),
		Err: "boom", LastFailed: time.Now().Add(-10 * time.Minute)})
	index(t, pool, 0, ds...)
	index(t, pool, 0, ds...) // again: nothing new
	if n := failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_records`); n != 31 {
		t.Fatalf("%d rows, want 31", n)
	}

	// Paging: latest first, no record twice, none missed.
	seen := map[int64]bool{}
	var last time.Time
	cursor := ""
	for pages := 0; ; pages++ {
		p, err := s.List(ctx, Filter{}, cursor, 7)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.Records {
			if seen[r.ID] {
				t.Fatalf("record %d twice", r.ID)
			}
			if !last.IsZero() && r.LastFailureAt.After(last) {
				t.Fatalf("record %d out of order", r.ID)
			}
			seen[r.ID], last = true, r.LastFailureAt
		}
		if p.Next == "" {
			if pages != 4 {
				t.Errorf("%d pages, want 5", pages+1)
			}
			break
		}
		cursor = p.Next
	}
	if len(seen) != 31 {
		t.Fatalf("paging saw %d records, want 31", len(seen))
	}

	tests := []struct {
		name string
		f    Filter
		want int
	}{
		{"group", Filter{Group: "ledger"}, 5},
		{"topic", Filter{Topic: "orders.billing.dlq"}, 26},
		{"kind", Filter{Kind: "decode"}, 10},
		{"error text, any case", Filter{ErrorContains: "DEADLINE"}, 20},
		{"error text with LIKE characters", Filter{ErrorContains: "100%_"}, 0},
		{"key: idempotency key", Filter{Key: "order-7"}, 1},
		{"key: derived idempotency key", Filter{Key: "derived-key"}, 1},
		{"key: Kafka key", Filter{Key: "kafka-key"}, 1},
		{"status", Filter{Status: []Status{Unresolved}}, 31},
		{"statuses", Filter{Status: []Status{Resolved, Archived}}, 0},
		{"since", Filter{Since: base.Add(20 * time.Minute)}, 11},
		{"until", Filter{Until: base.Add(time.Minute)}, 1},
		{"position", Filter{Topic: "orders.billing.dlq", HasOffset: true, Partition: 0, Offset: 3}, 1},
	}
	for _, tt := range tests {
		p, err := s.List(ctx, tt.f, "", 100)
		if err != nil || len(p.Records) != tt.want {
			t.Errorf("%s: %d records, %v; want %d", tt.name, len(p.Records), err, tt.want)
		}
	}
	r := mustList(t, s, Filter{Key: "derived-key"})[0]
	if r.IdempotencyKey != "derived-key" || string(r.Key) != "kafka-key" || r.Fingerprint != fingerprint("permanent", "*errors.errorString", "boom") ||
		r.OriginTopic != "orders" || r.Group != "billing" || r.Attempts != 3 || r.Status != Unresolved || len(r.Headers) < 3 ||
		string(r.Headers[0].Key) != "idempotency-key" {
		t.Errorf("record: %+v", r)
	}

	groups, err := s.Groups(ctx, Filter{Topic: "orders.billing.dlq"})
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 3 || groups[0].Count != 16 || groups[0].Kind != "timeout" || groups[0].Unresolved != 16 || groups[1].Count != 9 {
		t.Fatalf("groups: %+v", groups)
	}
	g := groups[0]
	if p, err := s.List(ctx, Filter{Topic: g.Topic, Fingerprint: g.Fingerprint[:6]}, "", 100); err != nil || len(p.Records) != 16 {
		t.Errorf("by fingerprint prefix: %d, %v", len(p.Records), err)
	}

	ov, err := s.Overview(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ov) != 2 || ov[0].Group != "billing" || ov[0].Unresolved != 26 || ov[0].OldestUnresolved.Unix() != base.Unix() ||
		ov[1].Group != "ledger" || ov[1].Unresolved != 5 || ov[0].ArrivalsLastHour+ov[1].ArrivalsLastHour != 1 {
		t.Errorf("overview: %+v", ov)
	}

	// Bad input is a ValidationError.
	var ve *ValidationError
	if _, err := s.List(ctx, Filter{Status: []Status{"pending"}}, "", 10); !errors.As(err, &ve) || ve.Field != "status" {
		t.Errorf("bad status: %v", err)
	}
	if _, err := s.List(ctx, Filter{}, "not-a-cursor", 10); !errors.As(err, &ve) || ve.Field != "cursor" {
		t.Errorf("bad cursor: %v", err)
	}
	if _, err := s.List(ctx, Filter{Fingerprint: "xyz"}, "", 10); !errors.As(err, &ve) {
		t.Errorf("bad fingerprint: %v", err)
	}
	if _, err := s.Get(ctx, 1<<40); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(unknown) = %v, want ErrNotFound", err)
	}
}

// mustList returns every record f matches, in List's order, each as Get
// reads it (List reads no values, stacks or headers).
func mustList(t *testing.T, s *Store, f Filter) []Record {
	t.Helper()
	p, err := s.List(testenv.Context(t), f, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range p.Records {
		if p.Records[i], err = s.Get(testenv.Context(t), r.ID); err != nil {
			t.Fatal(err)
		}
	}
	return p.Records
}

func TestSweepAndAudit(t *testing.T) {
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	s := NewStore(pool)
	index(t, pool, 0, dead{Topic: "a.g.dlq", Origin: "a", Key: "k1", Value: []byte("1"), Err: "e"},
		dead{Topic: "a.g.dlq", Origin: "a", Key: "k2", Value: []byte("2"), Err: "e"},
		dead{Topic: "a.g.dlq", Origin: "a", Key: "k3", Value: []byte("3"), Err: "e"})
	recs := mustList(t, s, Filter{})
	a := NewActions(s, nil)
	if _, err := a.Resolve(ctx, "alice", Selection{IDs: []int64{recs[0].ID}}, "fixed"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Archive(ctx, "bob", Selection{IDs: []int64{recs[1].ID}}, "test data"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idem_dlq_records SET status_at = now() - interval '40 days' WHERE id = $1`, recs[0].ID); err != nil {
		t.Fatal(err)
	}
	n, err := s.Sweep(ctx, 30*24*time.Hour)
	if err != nil || n != 1 {
		t.Fatalf("Sweep = %d, %v; want the one resolved 40 days ago", n, err)
	}
	if _, err := s.Get(ctx, recs[0].ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("swept record: %v", err)
	}
	if r, err := s.Get(ctx, recs[1].ID); err != nil || r.Status != Archived || r.StatusActor != "bob" || r.StatusReason != "test data" {
		t.Errorf("archived record: %+v, %v", r, err)
	}

	if err := s.WriteAudit(ctx, AuditEntry{Actor: "carol", Action: "reveal", RecordIDs: []int64{recs[2].ID}, Reason: "support ticket 7", Result: "ok"}); err != nil {
		t.Fatal(err)
	}
	var all []AuditEntry
	cursor := ""
	for {
		es, next, err := s.Audit(ctx, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, es...)
		if next == "" {
			break
		}
		cursor = next
	}
	if len(all) != 3 || all[0].Action != "reveal" || all[1].Action != "archive" || all[2].Action != "resolve" ||
		all[2].Actor != "alice" || all[2].Reason != "fixed" || all[2].Result != "ok: 1 resolved" || len(all[2].RecordIDs) != 1 {
		t.Errorf("audit: %+v", all)
	}
}

// TestGroupCountsFollowChanges: the per-group counts the triggers keep agree
// with counting the records, after inserts, status changes and a sweep.
func TestGroupCountsFollowChanges(t *testing.T) {
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	s := NewStore(pool)
	var ds []dead
	for i := range 40 {
		d := dead{Topic: fmt.Sprintf("t%d.g.dlq", i%2), Origin: "o", Key: fmt.Sprint("k", i), Value: []byte("{}"),
			Kind: handler.KindTimeout, Err: fmt.Sprintf("timeout %d", i%3), LastFailed: time.Now().Add(-time.Duration(i) * time.Minute)}
		if i%4 == 0 {
			d.Kind, d.Err = handler.KindDecode, "decode"
		}
		ds = append(ds, d)
	}
	index(t, pool, 0, ds[:25]...)
	index(t, pool, 25, ds[25:]...)
	index(t, pool, 0, ds[:10]...) // already indexed: counted once
	a := NewActions(s, nil)
	recs := mustList(t, s, Filter{})
	var ids []int64
	for _, r := range recs[:12] {
		ids = append(ids, r.ID)
	}
	if _, err := a.Resolve(ctx, "alice", Selection{IDs: ids[:6]}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Archive(ctx, "alice", Selection{IDs: ids[4:12]}, "noise"); err != nil {
		t.Fatal(err)
	}
	compare := func(when string) {
		t.Helper()
		for _, st := range [][]Status{nil, {Unresolved}, {Resolved, Archived}, {Replayed}} {
			fast, err := s.Groups(ctx, Filter{Status: st})
			if err != nil {
				t.Fatal(err)
			}
			slow, err := s.Groups(ctx, Filter{Status: st, Since: time.Unix(1, 0)}) // reads the records
			if err != nil {
				t.Fatal(err)
			}
			key := func(gs []FailureGroup) string {
				var b []string
				for _, g := range gs {
					b = append(b, fmt.Sprintf("%s/%s/%s/%s=%d,%d", g.Group, g.Topic, g.Fingerprint, g.Kind, g.Count, g.Unresolved))
				}
				slices.Sort(b)
				return fmt.Sprint(b)
			}
			if key(fast) != key(slow) {
				t.Errorf("%s, status %v: counts %s, records %s", when, st, key(fast), key(slow))
			}
		}
		ov, err := s.Overview(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var unresolved int
		for _, o := range ov {
			unresolved += o.Unresolved
		}
		if want := failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_records WHERE status = 'unresolved'`); int64(unresolved) != want {
			t.Errorf("%s: overview counts %d unresolved, want %d", when, unresolved, want)
		}
	}
	compare("after the changes")
	if _, err := pool.Exec(ctx, `UPDATE idem_dlq_records SET status_at = now() - interval '90 days' WHERE status <> 'unresolved'`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Sweep(ctx, 30*24*time.Hour); err != nil || n != 12 {
		t.Fatalf("Sweep = %d, %v", n, err)
	}
	compare("after the sweep")
}

// TestGroupsNameTheirSampleRecord: a failure group names the record whose
// error is its sample (SampleID, for masking that error with the record's
// masked values), from the per-group counts (idem_dlq_groups, kept by the
// index's triggers) and from the records alike, before and after a status
// change.
func TestGroupsNameTheirSampleRecord(t *testing.T) {
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	s := NewStore(pool)
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	index(t, pool, 0,
		dead{Topic: "orders.billing.dlq", Origin: "orders", Key: "order-0", Value: []byte(`{}`), Err: "ledger down", LastFailed: base},
		dead{Topic: "orders.billing.dlq", Origin: "orders", Key: "order-1", Value: []byte(`{}`), Err: "ledger down", LastFailed: base.Add(time.Minute)})
	latest := mustList(t, s, Filter{Key: "order-1"})[0].ID
	check := func(when string) {
		t.Helper()
		for _, f := range []Filter{{}, {ErrorContains: "ledger"}} {
			gs, err := s.Groups(ctx, f)
			if err != nil || len(gs) != 1 || gs[0].SampleID != latest || gs[0].SampleError != "ledger down" {
				t.Errorf("%s: Groups(%+v) = %+v, %v; want one group whose sample is record %d", when, f, gs, err, latest)
			}
		}
	}
	check("indexed")
	if _, err := NewActions(s, nil).Resolve(ctx, "alice", Selection{IDs: []int64{latest}}, "done"); err != nil {
		t.Fatal(err)
	}
	check("resolved")
}
