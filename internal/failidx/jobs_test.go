package failidx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// waitJob polls job id until ok says it is where the test wants it.
func waitJob(t *testing.T, s *Store, id int64, ok func(Job) bool) Job {
	t.Helper()
	var j Job
	testenv.Eventually(t, 60*time.Second, func() error {
		var err error
		if j, err = s.Job(context.Background(), id); err != nil {
			return err
		}
		if !ok(j) {
			return fmt.Errorf("job %d: %+v", id, j)
		}
		return nil
	})
	return j
}

// TestJobResumesWithoutPublishingTwice: a process dies between a send
// Kafka acknowledged and its record (the test's afterSend hook stops the
// job there, as a crash would). Another process resumes the job once its
// heartbeat is older than the lease: it finds the record in the
// destination (its idem-replay-of, after the offset stored before the
// send) and marks it replayed without sending it again, then publishes the
// rest. The origin's high-water mark rises by 3 for 3 records.
func TestJobResumesWithoutPublishingTwice(t *testing.T) {
	r := newReplayEnv(t, 3)
	ctx := testenv.Context(t)
	ids := []int64{r.recs[0].ID, r.recs[1].ID, r.recs[2].ID}
	dying := NewActions(r.s, producerClient(t, r.k))
	dying.afterSend = func(id int64) error {
		if id == ids[1] {
			return errCrash
		}
		return nil
	}
	if _, err := dying.Replay(ctx, "alice", Selection{IDs: ids}, "", 0, "crash test"); !errors.Is(err, errCrash) {
		t.Fatalf("Replay = %v, want the simulated crash", err)
	}
	if n := failidxtest.EndOffsets(t, r.k, r.origin); n != 2 {
		t.Fatalf("%d records published before the crash, want 2", n)
	}
	if st := statuses(t, r.pool); st[ids[0]] != Replayed || st[ids[1]] != Replaying || st[ids[2]] != Replaying {
		t.Fatalf("statuses after the crash: %v", st)
	}

	heir := NewActions(r.s, producerClient(t, r.k))
	if got, err := heir.ResumeJobs(ctx); err != nil || len(got) != 0 {
		t.Fatalf("ResumeJobs while the heartbeat is fresh = %v, %v; want none", got, err)
	}
	heir.lease = time.Millisecond // the dead process's heartbeat is now too old
	resumed, err := heir.ResumeJobs(ctx)
	if err != nil || len(resumed) != 1 {
		t.Fatalf("ResumeJobs = %v, %v; want the job", resumed, err)
	}
	j, err := heir.RunJob(ctx, resumed[0])
	if err != nil || j.State != JobDone || j.Done != 3 {
		t.Fatalf("RunJob = %+v, %v; want done, 3 replayed", j, err)
	}
	if n := failidxtest.EndOffsets(t, r.k, r.origin); n != 3 {
		t.Errorf("the origin's high-water mark is %d, want 3 (the record in doubt not sent twice)", n)
	}
	for _, id := range ids {
		if st := statuses(t, r.pool)[id]; st != Replayed {
			t.Errorf("record %d: %s", id, st)
		}
	}
	if e := lastAudit(t, r.s); e.Action != "replay" || e.Result != "ok: 3 replayed" || len(e.RecordIDs) != 3 {
		t.Errorf("audit: %+v", e)
	}
}

// TestJobHandedBackResumedAndCancelled: a paced replay job stops with its
// process (ctx ends): it is handed back, unfinished. Another process
// resumes it at once and publishes on; a third operator cancels it. The
// records not published go back to unresolved, every published one is
// replayed, the high-water mark rose by exactly the records published, and
// the audit log says who cancelled.
//
// The test decides where each process is stopped, whatever the machine's
// speed (at load 30 the job once ran to done before the cancel landed):
// the first process's third send waits for its ctx to end, so it stops
// after 2 or 3 records; the second's second send waits until the cancel
// is requested. 16 records at 4 a second leave at least 10 to send after
// that, which the pacing spreads over at least 2.25 s, and a cancel is
// seen at the first record a second after the last heartbeat.
func TestJobHandedBackResumedAndCancelled(t *testing.T) {
	const n = 16
	r := newReplayEnv(t, n)
	ctx := testenv.Context(t)
	var ids []int64
	for _, rec := range r.recs[:n] {
		ids = append(ids, rec.ID)
	}
	first := NewActions(r.s, producerClient(t, r.k))
	j, err := first.StartReplay(ctx, "alice", Selection{IDs: ids}, "", 4, "paced")
	if err != nil || j.Claimed != n {
		t.Fatalf("StartReplay = %+v, %v", j, err)
	}
	runCtx, stop := context.WithCancel(ctx)
	sends := 0 // RunJob's goroutine alone counts
	first.afterSend = func(int64) error {
		if sends++; sends == 3 {
			<-runCtx.Done()
		}
		return nil
	}
	done := make(chan error, 1)
	go func() { _, err := first.RunJob(runCtx, j.ID); done <- err }()
	waitJob(t, r.s, j.ID, func(j Job) bool { return j.Done >= 2 })
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunJob after its context ended = %v", err)
	}
	j = waitJob(t, r.s, j.ID, func(j Job) bool { return j.State == JobRunning && j.Owner == "" })

	second := NewActions(r.s, producerClient(t, r.k))
	resumed, err := second.ResumeJobs(ctx)
	if err != nil || len(resumed) != 1 || resumed[0] != j.ID {
		t.Fatalf("ResumeJobs = %v, %v", resumed, err)
	}
	atSecond, cancelled := make(chan struct{}), make(chan struct{})
	second.afterSend = func(int64) error {
		if sends++; sends == 5 { // the second's second send
			close(atSecond)
			select {
			case <-cancelled:
			case <-ctx.Done():
			}
		}
		return nil
	}
	go func() { _, err := second.RunJob(ctx, j.ID); done <- err }()
	select {
	case <-atSecond:
	case err := <-done:
		t.Fatalf("the resumed RunJob ended before its second send: %v", err)
	case <-ctx.Done():
		t.Fatal("the resumed RunJob did not reach its second send")
	}
	if _, err := NewActions(r.s, producerClient(t, r.k)).CancelJob(ctx, "carol", j.ID); err != nil {
		t.Fatal(err)
	}
	close(cancelled)
	if err := <-done; err != nil {
		t.Fatalf("the resumed RunJob = %v", err)
	}
	j, err = r.s.Job(ctx, j.ID)
	if err != nil || j.State != JobCancelled || j.Done >= n || j.Done < 4 {
		t.Fatalf("job after the cancel: %+v, %v", j, err)
	}
	if n := failidxtest.EndOffsets(t, r.k, r.origin); n != int64(j.Done) {
		t.Errorf("the origin's high-water mark is %d, want the %d records published", n, j.Done)
	}
	replayed, unresolved := 0, 0
	for _, id := range ids {
		switch st := statuses(t, r.pool)[id]; st {
		case Replayed:
			replayed++
		case Unresolved:
			unresolved++
		default:
			t.Errorf("record %d: %s", id, st)
		}
	}
	if replayed != j.Done || unresolved != n-j.Done {
		t.Errorf("%d replayed and %d unresolved, want %d and %d", replayed, unresolved, j.Done, n-j.Done)
	}
	if e := lastAudit(t, r.s); !strings.HasPrefix(e.Result, "cancelled by carol") {
		t.Errorf("audit: %+v", e)
	}
}

// TestCancelAnOrphanedJob: a job no process runs (its holder died) is
// cancelled by the operator's own process: nothing is published and every
// record goes back to unresolved.
func TestCancelAnOrphanedJob(t *testing.T) {
	r := newReplayEnv(t, 2)
	ctx := testenv.Context(t)
	ids := []int64{r.recs[0].ID, r.recs[1].ID}
	j, err := NewActions(r.s, producerClient(t, r.k)).StartReplay(ctx, "alice", Selection{IDs: ids}, "", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	canceller := NewActions(r.s, producerClient(t, r.k))
	canceller.lease = time.Millisecond
	j, err = canceller.CancelJob(ctx, "carol", j.ID)
	if err != nil || j.State != JobCancelled || j.Done != 0 {
		t.Fatalf("CancelJob = %+v, %v", j, err)
	}
	if n := failidxtest.EndOffsets(t, r.k, r.origin); n != 0 {
		t.Errorf("%d records published", n)
	}
	for _, id := range ids {
		if st := statuses(t, r.pool)[id]; st != Unresolved {
			t.Errorf("record %d: %s", id, st)
		}
	}
}
