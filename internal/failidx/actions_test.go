package failidx

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// producerClient returns a client set up for Actions, closed when the test ends.
func producerClient(t *testing.T, k *testenv.Kafka) sarama.Client {
	t.Helper()
	return failidxtest.Client(t, k, ProducerConfig(k.SaramaConfig()))
}

// statuses returns each record's status by id.
func statuses(t *testing.T, pool *pgxpool.Pool) map[int64]Status {
	t.Helper()
	rows, err := pool.Query(testenv.Context(t), `SELECT id, status FROM idem_dlq_records`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]Status{}
	for rows.Next() {
		var id int64
		var s string
		if err := rows.Scan(&id, &s); err != nil {
			t.Fatal(err)
		}
		out[id] = Status(s)
	}
	return out
}

// lastAudit returns the newest audit entry.
func lastAudit(t *testing.T, s *Store) AuditEntry {
	t.Helper()
	es, _, err := s.Audit(testenv.Context(t), "", 1)
	if err != nil || len(es) != 1 {
		t.Fatalf("audit: %v, %v", es, err)
	}
	return es[0]
}

// seedIndexed indexes n records of origin plus one stub, all in dlqTopic
// partition 0, and returns them oldest first.
func seedIndexed(t *testing.T, pool *pgxpool.Pool, dlqTopic, origin string, n int) []Record {
	t.Helper()
	var ds []dead
	for i := range n {
		ds = append(ds, dead{Topic: dlqTopic, Origin: origin, Key: fmt.Sprint("pay-", i), Value: []byte(fmt.Sprintf(`{"payment":"pay-%d","amount":%d}`, i, 10*i)),
			Err: fmt.Sprintf("ledger refused pay-%d", i), LastFailed: time.Now().Add(time.Duration(i-n) * time.Minute)})
	}
	ds = append(ds, dead{Topic: dlqTopic, Origin: origin, Key: "stub-1", Stub: true, Err: "too large"})
	index(t, pool, 0, ds...)
	recs := mustList(t, NewStore(pool), Filter{Topic: dlqTopic})
	slices.Reverse(recs)
	return recs
}

// replayEnv is n records of a new origin topic and a stub, indexed
// (seedIndexed), with a Store and Actions on them.
type replayEnv struct {
	k        *testenv.Kafka
	pool     *pgxpool.Pool
	dlqTopic string
	origin   string
	recs     []Record
	s        *Store
	a        *Actions
}

func newReplayEnv(t *testing.T, n int) replayEnv {
	t.Helper()
	r := replayEnv{k: testenv.NewKafka(t)}
	r.pool, _ = failidxtest.NewPool(t)
	r.dlqTopic, r.origin = r.k.Topic(t, 1), r.k.Topic(t, 1)
	r.recs = seedIndexed(t, r.pool, r.dlqTopic, r.origin, n)
	r.s = NewStore(r.pool)
	r.a = NewActions(r.s, producerClient(t, r.k))
	return r
}

// TestReplaySubsetLeavesTheRestUnresolved replays two records and a stub:
// exactly the two are published (byte for byte, idempotency key kept, no
// idem-* header), marked replayed by the actor; the stub and every other
// record stay unresolved; a second replay publishes nothing.
func TestReplaySubsetLeavesTheRestUnresolved(t *testing.T) {
	r := newReplayEnv(t, 5)
	k, pool, ctx, dlqTopic, origin, recs, s, a := r.k, r.pool, testenv.Context(t), r.dlqTopic, r.origin, r.recs, r.s, r.a
	stub := recs[5]

	res, err := a.Replay(ctx, "alice", Selection{IDs: []int64{recs[1].ID, recs[3].ID, stub.ID}}, "", 0, "ledger fixed")
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 3 || res.Done != 2 || !slices.Equal(res.SkippedStubs, []int64{stub.ID}) {
		t.Fatalf("Replay = %+v", res)
	}
	got := failidxtest.ReadAll(t, k, origin)
	if len(got) != 2 {
		t.Fatalf("origin got %d records, want 2", len(got))
	}
	for i, m := range got {
		want := recs[[]int{1, 3}[i]]
		if string(m.Value) != string(want.Value) || string(m.Key) != string(want.Key) {
			t.Errorf("published %q %q, want %q %q", m.Key, m.Value, want.Key, want.Value)
		}
		if v, _ := failidxtest.Header(m, "idempotency-key"); v != want.IdempotencyKey {
			t.Errorf("idempotency-key %q, want %q", v, want.IdempotencyKey)
		}
		for _, h := range m.Headers {
			if wire.IsIdemHeader(h.Key) {
				t.Errorf("replayed record carries %s", h.Key)
			}
		}
	}
	st := statuses(t, pool)
	for i, r := range recs {
		want := Unresolved
		if i == 1 || i == 3 {
			want = Replayed
		}
		if st[r.ID] != want {
			t.Errorf("record %d (%s): %s, want %s", r.ID, r.Key, st[r.ID], want)
		}
	}
	r1, _ := s.Get(ctx, recs[1].ID)
	if r1.StatusActor != "alice" || r1.StatusReason != "ledger fixed" {
		t.Errorf("status by %q for %q", r1.StatusActor, r1.StatusReason)
	}
	e := lastAudit(t, s)
	if e.Action != "replay" || e.Actor != "alice" || e.Reason != "ledger fixed" || len(e.RecordIDs) != 3 || e.Result != "ok: 2 replayed, 1 skipped (1 stubs)" {
		t.Errorf("audit: %+v", e)
	}

	// Again: nothing is published twice.
	res, err = a.Replay(ctx, "alice", Selection{IDs: []int64{recs[1].ID, recs[3].ID, stub.ID}}, "", 0, "again")
	if err != nil || res.Done != 0 || res.Skipped != 3 {
		t.Fatalf("second Replay = %+v, %v", res, err)
	}
	// A whole group by filter, paced: the rest but the stub.
	res, err = a.Replay(ctx, "bob", Selection{Filter: &Filter{Topic: dlqTopic}}, "", 100, "the rest")
	if err != nil || res.Done != 3 || len(res.SkippedStubs) != 1 {
		t.Fatalf("Replay by filter = %+v, %v", res, err)
	}
	if got := failidxtest.ReadAll(t, k, origin); len(got) != 5 {
		t.Fatalf("origin has %d records, want 5", len(got))
	}
	if st := statuses(t, pool); st[stub.ID] != Unresolved {
		t.Errorf("stub: %s", st[stub.ID])
	}
}

// TestReplayToTierKeepsHistory replays to a named tier topic: the record
// keeps its idem-* history, due now.
func TestReplayToTierKeepsHistory(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	dlqTopic, origin := k.Topic(t, 1), k.Topic(t, 1)
	tier := retrytopic.Policy{}.Tier(origin, "billing", 2)
	k.CreateTopic(t, tier, 1)
	recs := seedIndexed(t, pool, dlqTopic, origin, 1)
	a := NewActions(NewStore(pool), producerClient(t, k))
	if res, err := a.Replay(ctx, "alice", Selection{IDs: []int64{recs[0].ID}}, tier, 0, ""); err != nil || res.Done != 1 {
		t.Fatalf("Replay = %+v, %v", res, err)
	}
	got := failidxtest.ReadAll(t, k, tier)
	if len(got) != 1 {
		t.Fatalf("tier has %d records", len(got))
	}
	f, _, _ := wire.Decode(got[0].Headers)
	if f.Tier != 2 || f.OriginalTopic != origin || f.DueAt.IsZero() || f.Attempt != 3 {
		t.Errorf("tier record failure: %+v", f)
	}
}

// TestActionsBadInput: a malformed JSON edit, an edit dropping the
// idempotency key, an unknown record, a replay to a topic that does not
// exist (named, or a record's origin), an empty reason where one is
// required: each is a clear error, nothing is published or changed, and the
// refusal is audited.
func TestActionsBadInput(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	dlqTopic, origin := k.Topic(t, 1), k.Topic(t, 1)
	recs := seedIndexed(t, pool, dlqTopic, origin, 2)
	gone := testenv.Unique("deleted_origin")
	index(t, pool, 100, dead{Topic: dlqTopic, Origin: gone, Key: "orphan", Value: []byte(`{}`), Err: "x"})
	orphan := mustList(t, NewStore(pool), Filter{Key: "orphan"})[0]
	s := NewStore(pool)
	a := NewActions(s, producerClient(t, k))
	before := statuses(t, pool)
	var ve *ValidationError

	steps := []struct {
		name  string
		do    func() error
		check func(error) bool
	}{
		{"malformed JSON edit", func() error {
			_, err := a.EditAndRetry(ctx, "alice", recs[0].ID, []byte(`{"payment":"pay-0",`), "fix amount")
			return err
		}, func(err error) bool { return errors.As(err, &ve) && ve.Field == "value" }},
		{"edit drops the idempotency key", func() error {
			_, err := a.EditAndRetry(ctx, "alice", recs[0].ID, []byte(`{"payment":"pay-X","amount":1}`), "fix")
			return err
		}, func(err error) bool { return errors.As(err, &ve) && ve.Field == "value" }},
		{"empty edit", func() error {
			_, err := a.EditAndRetry(ctx, "alice", recs[0].ID, []byte("  "), "fix")
			return err
		}, func(err error) bool { return errors.As(err, &ve) && ve.Field == "value" }},
		{"unknown record: edit", func() error {
			_, err := a.EditAndRetry(ctx, "alice", 1<<40, []byte(`{}`), "fix")
			return err
		}, func(err error) bool { return errors.Is(err, ErrNotFound) }},
		{"unknown record: replay", func() error {
			_, err := a.Replay(ctx, "alice", Selection{IDs: []int64{recs[0].ID, 1 << 40}}, "", 0, "")
			return err
		}, func(err error) bool { return errors.Is(err, ErrNotFound) }},
		{"unknown record: resolve", func() error {
			_, err := a.Resolve(ctx, "alice", Selection{IDs: []int64{1 << 40}}, "")
			return err
		}, func(err error) bool { return errors.Is(err, ErrNotFound) }},
		{"replay to a missing topic", func() error {
			// The records' own tier 9, which does not exist.
			_, err := a.Replay(ctx, "alice", Selection{IDs: []int64{recs[0].ID, recs[1].ID}}, retrytopic.Policy{}.Tier(origin, "billing", 9), 0, "")
			return err
		}, func(err error) bool { return errors.Is(err, dlq.ErrUnknownTopic) }},
		{"replay with a missing origin", func() error {
			_, err := a.Replay(ctx, "alice", Selection{IDs: []int64{recs[0].ID, orphan.ID}}, "", 0, "")
			return err
		}, func(err error) bool { return errors.Is(err, dlq.ErrUnknownTopic) }},
		{"archive without a reason", func() error {
			_, err := a.Archive(ctx, "alice", Selection{IDs: []int64{recs[0].ID}}, " ")
			return err
		}, func(err error) bool { return errors.As(err, &ve) && ve.Field == "reason" }},
		{"no selection", func() error {
			_, err := a.Resolve(ctx, "alice", Selection{}, "")
			return err
		}, func(err error) bool { return errors.As(err, &ve) && ve.Field == "selection" }},
		{"no actor", func() error {
			_, err := a.Resolve(ctx, "", Selection{IDs: []int64{recs[0].ID}}, "")
			return err
		}, func(err error) bool { return errors.As(err, &ve) && ve.Field == "actor" }},
	}
	audits := 0
	for _, st := range steps {
		err := st.do()
		t.Logf("%s: %v", st.name, err)
		if err == nil || !st.check(err) {
			t.Errorf("%s: error %v", st.name, err)
		}
		if st.name != "no actor" {
			audits++
			if e := lastAudit(t, s); e.Result == "" || e.Result[:5] != "error" {
				t.Errorf("%s: audit result %q", st.name, e.Result)
			}
		}
	}
	if got := failidxtest.ReadAll(t, k, origin); len(got) != 0 {
		t.Errorf("%d records published", len(got))
	}
	if after := statuses(t, pool); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("statuses changed: %v -> %v", before, after)
	}
	if n := failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_versions`); n != 0 {
		t.Errorf("%d versions stored", n)
	}
	if n := failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_audit`); n != int64(audits) {
		t.Errorf("%d audit rows, want %d", n, audits)
	}
}

// TestEditAndRetry publishes an edited JSON value under the same key with
// idem-replaces, keeps the original and stores the edit as a version; a
// second edit of the record, now replayed, is refused (ErrConflict).
func TestEditAndRetry(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	dlqTopic, origin := k.Topic(t, 1), k.Topic(t, 1)
	recs := seedIndexed(t, pool, dlqTopic, origin, 1)
	r := recs[0]
	s := NewStore(pool)
	a := NewActions(s, producerClient(t, k))
	edit := `{"payment":"pay-0","amount":5}`
	if res, err := a.EditAndRetry(ctx, "alice", r.ID, []byte(edit), "amount was negative"); err != nil || res.Done != 1 {
		t.Fatalf("EditAndRetry = %+v, %v", res, err)
	}
	if _, err := a.EditAndRetry(ctx, "alice", r.ID, []byte(`{"payment": "pay-0", "amount": 6}`), "again"); !errors.Is(err, ErrConflict) {
		t.Fatalf("a second edit of the replayed record: %v, want ErrConflict", err)
	}
	got := failidxtest.ReadAll(t, k, origin)
	if len(got) != 1 {
		t.Fatalf("origin has %d records, want 1", len(got))
	}
	m := got[0]
	rep, _ := failidxtest.Header(m, headerReplaces)
	key, _ := failidxtest.Header(m, "idempotency-key")
	if string(m.Value) != edit || string(m.Key) != "pay-0" || key != "pay-0" || rep != fmt.Sprintf("%s/0/%d", dlqTopic, r.Offset) {
		t.Errorf("published %q key %q idempotency-key %q idem-replaces %q", m.Value, m.Key, key, rep)
	}
	after, err := s.Get(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if string(after.Value) != string(r.Value) || after.Status != Replayed || len(after.Versions) != 1 {
		t.Fatalf("after the edit: value %q status %s versions %d", after.Value, after.Status, len(after.Versions))
	}
	if v := after.Versions[0]; v.N != 1 || string(v.Value) != edit || v.Actor != "alice" || v.PublishedTo != origin || v.PublishedOffset != m.Offset {
		t.Errorf("version: %+v", v)
	}
	es, _, err := s.Audit(ctx, "", 2)
	if err != nil || len(es) != 2 || es[1].Action != "edit-retry" || es[1].Result != "ok: 1 published" ||
		!strings.HasPrefix(es[0].Result, "error") || !strings.Contains(es[0].Result, "replayed") {
		t.Errorf("audit: %+v, %v", es, err)
	}
}

// TestReplayAtARate: a replay with a rate paces its sends (4 records at 5/s
// take at least the 3 intervals between them), sends each selected record
// once, and names the rate in its audit row.
func TestReplayAtARate(t *testing.T) {
	r := newReplayEnv(t, 4)
	k, ctx, origin, recs, s, a := r.k, testenv.Context(t), r.origin, r.recs, r.s, r.a

	ids := []int64{recs[0].ID, recs[1].ID, recs[2].ID, recs[3].ID}
	start := time.Now()
	res, err := a.Replay(ctx, "alice", Selection{IDs: ids}, "", 5, "paced")
	elapsed := time.Since(start)
	if err != nil || res.Done != 4 {
		t.Fatalf("Replay at 5/s = %+v, %v", res, err)
	}
	if min := 3 * time.Second / 5; elapsed < min {
		t.Errorf("4 records at 5/s took %v, less than the %v between them", elapsed, min)
	}
	if got := failidxtest.ReadAll(t, k, origin); len(got) != 4 {
		t.Errorf("origin got %d records, want 4", len(got))
	}
	if e := lastAudit(t, s); e.Action != "replay" || !strings.Contains(e.Detail, "rate 5/s") || len(e.RecordIDs) != 4 {
		t.Errorf("audit row %+v, want a replay of 4 naming rate 5/s", e)
	}
	if _, err := a.Replay(ctx, "alice", Selection{IDs: ids}, "", -1, "bad"); !errors.As(err, new(*ValidationError)) {
		t.Errorf("Replay at -1/s: %v, want a ValidationError", err)
	}
}

// TestWithoutOrderingOrOutboxTables: on a database that holds the index's
// tables but neither the ordering tables nor the outbox (a console that
// serves dead letters only), the parked keys and failed outbox rows are
// empty, not an error.
func TestWithoutOrderingOrOutboxTables(t *testing.T) {
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	a := NewActions(NewStore(pool), nil)
	if ks, _, err := a.ParkedKeys(ctx, "", 0); err != nil || len(ks) != 0 {
		t.Errorf("ParkedKeys = %v, %v; want none", ks, err)
	}
	if rows, err := a.FailedOutbox(ctx, 0); err != nil || len(rows) != 0 {
		t.Errorf("FailedOutbox = %v, %v; want none", rows, err)
	}
}
