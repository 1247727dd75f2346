package failidx

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// TestConcurrentReplaysPublishOnce: two operators replay the same 20 records
// at once (paced, so both are sending at the same time). Each record is
// claimed by one of them in the statement that selects it, so the origin's
// high-water mark rises by 20, not 40, and every record is replayed once.
func TestConcurrentReplaysPublishOnce(t *testing.T) {
	r := newReplayEnv(t, 20)
	ctx := testenv.Context(t)
	var ids []int64
	for _, rec := range r.recs[:20] {
		ids = append(ids, rec.ID)
	}
	before := failidxtest.EndOffsets(t, r.k, r.origin)
	var wg sync.WaitGroup
	results := make([]Result, 2)
	errs := make([]error, 2)
	start := make(chan struct{})
	for i, actor := range []string{"alice", "bob"} {
		a := NewActions(r.s, producerClient(t, r.k))
		wg.Go(func() {
			<-start
			results[i], errs[i] = a.Replay(ctx, actor, Selection{IDs: ids}, "", 50, "both at once")
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if rose := failidxtest.EndOffsets(t, r.k, r.origin) - before; rose != 20 {
		t.Errorf("the origin's high-water mark rose by %d, want 20 (each record once)", rose)
	}
	if done := results[0].Done + results[1].Done; done != 20 {
		t.Errorf("replayed %d + %d records, want 20 in all", results[0].Done, results[1].Done)
	}
	for id, st := range statuses(t, r.pool) {
		if id != r.recs[20].ID && st != Replayed {
			t.Errorf("record %d is %s", id, st)
		}
	}
}

// TestConcurrentEditsOneWins: two operators edit and retry the same record
// at once. One edit is published and stored as a version; the other gets
// ErrConflict (the record is no longer unresolved), having published and
// stored nothing.
func TestConcurrentEditsOneWins(t *testing.T) {
	r := newReplayEnv(t, 1)
	ctx := testenv.Context(t)
	id := r.recs[0].ID
	var wg sync.WaitGroup
	errs := make([]error, 2)
	start := make(chan struct{})
	for i := range 2 {
		a := NewActions(r.s, producerClient(t, r.k))
		wg.Go(func() {
			<-start
			_, errs[i] = a.EditAndRetry(ctx, fmt.Sprint("op-", i), id, fmt.Appendf(nil, `{"payment":"pay-0","amount":%d}`, i+1), "fix")
		})
	}
	close(start)
	wg.Wait()
	ok, conflicts := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrConflict):
			conflicts++
		default:
			t.Errorf("EditAndRetry: %v", err)
		}
	}
	if ok != 1 || conflicts != 1 {
		t.Errorf("%d edits published, %d conflicts; want 1 and 1 (errors %v)", ok, conflicts, errs)
	}
	if n := failidxtest.Count(t, r.pool, `SELECT count(*) FROM idem_dlq_versions`); n != 1 {
		t.Errorf("%d versions stored, want 1", n)
	}
	if got := failidxtest.ReadAll(t, r.k, r.origin); len(got) != 1 {
		t.Errorf("%d records published, want 1", len(got))
	}
	// A record that is no longer unresolved is refused.
	if _, err := NewActions(r.s, producerClient(t, r.k)).EditAndRetry(ctx, "alice", id, []byte(`{"payment":"pay-0"}`), "again"); !errors.Is(err, ErrConflict) {
		t.Errorf("edit of a replayed record: %v, want ErrConflict", err)
	}
}

// TestReplayTargets: a replay goes to each record's origin topic or to a
// retry tier of that origin for the record's group, nowhere else. A foreign
// topic (existing), another group's tier, or the DLQ itself is a
// ValidationError on "to": nothing published, the refusal audited. A topic
// listed in ReplayTopics is allowed, and the audit says so.
func TestReplayTargets(t *testing.T) {
	r := newReplayEnv(t, 2)
	ctx := testenv.Context(t)
	foreign := r.k.Topic(t, 1)
	otherGroup := retrytopic.Policy{}.Tier(r.origin, "payroll", 1)
	ownTier := retrytopic.Policy{}.Tier(r.origin, "billing", 1)
	r.k.CreateTopic(t, otherGroup, 1)
	r.k.CreateTopic(t, ownTier, 1)
	ids := []int64{r.recs[0].ID}
	for _, to := range []string{foreign, otherGroup, r.dlqTopic} {
		_, err := r.a.Replay(ctx, "olga", Selection{IDs: ids}, to, 0, "")
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Field != "to" {
			t.Errorf("replay to %s: %v, want a ValidationError on to", to, err)
		}
		if e := lastAudit(t, r.s); e.Action != "replay" || e.Result[:5] != "error" {
			t.Errorf("replay to %s: audit %+v", to, e)
		}
		if n := failidxtest.EndOffsets(t, r.k, to); to != r.dlqTopic && n != 0 {
			t.Errorf("replay to %s published %d records", to, n)
		}
	}
	if res, err := r.a.Replay(ctx, "olga", Selection{IDs: ids}, ownTier, 0, ""); err != nil || res.Done != 1 {
		t.Errorf("replay to the record's own tier %s: %+v, %v", ownTier, res, err)
	}
	allowed := NewActions(r.s, producerClient(t, r.k))
	allowed.ReplayTopics = []string{foreign}
	if res, err := allowed.Replay(ctx, "olga", Selection{IDs: []int64{r.recs[1].ID}}, foreign, 0, ""); err != nil || res.Done != 1 {
		t.Fatalf("replay to a listed topic: %+v, %v", res, err)
	}
	if e := lastAudit(t, r.s); !strings.Contains(e.Detail, "allowed by --replay-topic") {
		t.Errorf("audit of a replay to a listed topic: %+v", e)
	}
}
