package control_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/control"
	"github.com/idemhq/idem/internal/failidx"
)

func db(t *testing.T) *pgxpool.Pool {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped with -short")
	}
	return idemtest.ConnectPostgres(t).Pool
}

// audits returns the audit rows of action, oldest first.
func audits(t *testing.T, pool *pgxpool.Pool, action string) []failidx.AuditEntry {
	t.Helper()
	es, _, err := failidx.NewStore(pool).Audit(t.Context(), "", 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []failidx.AuditEntry
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Action == action {
			out = append(out, es[i])
		}
	}
	return out
}

// TestPauseIsClaimedAndAudited: a pause claims its row (a second pause of
// the same partition is ErrConflict, naming who paused it), a resume ends
// it (a second resume is ErrConflict), each writes one audit row, and a
// state read says which pause holds a partition (its own before its
// topic's).
func TestPauseIsClaimedAndAudited(t *testing.T) {
	pool := db(t)
	ctx := t.Context()
	a := control.Admin{DB: pool}
	p := control.Pause{Group: "billing", Topic: "payments", Partition: 3, Reason: "ledger migration"}
	if _, err := a.Pause(ctx, "alice", p); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pause(ctx, "bob", p); !errors.Is(err, control.ErrConflict) || !strings.Contains(err.Error(), "by alice") {
		t.Fatalf("second pause: %v, want ErrConflict naming alice", err)
	}
	if _, err := a.Pause(ctx, "bob", control.Pause{Group: "billing", Topic: "payments", Partition: control.AllPartitions}); err == nil {
		t.Fatal("a pause without a reason was accepted")
	}
	whole := control.Pause{Group: "billing", Topic: "payments", Partition: control.AllPartitions, Reason: "all of it"}
	if _, err := a.Pause(ctx, "bob", whole); err != nil {
		t.Fatal(err)
	}
	s, err := control.Load(ctx, pool, "billing")
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := s.Paused("payments", 3); !ok || got.By != "alice" {
		t.Errorf("partition 3 paused by %+v, want alice's pause", got)
	}
	if got, ok := s.Paused("payments", 0); !ok || got.By != "bob" || got.Partition != control.AllPartitions {
		t.Errorf("partition 0 paused by %+v, want bob's pause of the topic", got)
	}
	if _, ok := s.Paused("refunds", 0); ok {
		t.Error("another topic is paused")
	}
	if other, err := control.Load(ctx, pool, "payroll"); err != nil || len(other.Pauses) != 0 {
		t.Errorf("another group's state: %+v, %v", other, err)
	}
	got, err := a.Resume(ctx, "carol", control.Pause{Group: "billing", Topic: "payments", Partition: 3})
	if err != nil || got.By != "alice" {
		t.Fatalf("resume = %+v, %v", got, err)
	}
	if _, err := a.Resume(ctx, "carol", control.Pause{Group: "billing", Topic: "payments", Partition: 3}); !errors.Is(err, control.ErrConflict) {
		t.Fatalf("second resume: %v, want ErrConflict", err)
	}
	if ps, _ := a.Pauses(ctx, ""); len(ps) != 1 || ps[0].Partition != control.AllPartitions {
		t.Errorf("pauses left: %+v, want the topic's", ps)
	}
	if n := len(audits(t, pool, "pause")); n != 2 {
		t.Errorf("%d pause audit rows, want 2", n)
	}
	rs := audits(t, pool, "resume")
	if len(rs) != 1 || rs[0].Actor != "carol" || !strings.Contains(rs[0].Detail, "payments/3") {
		t.Errorf("resume audit rows: %+v", rs)
	}
}

func request(topic string) control.RedriveRequest {
	return control.RedriveRequest{Group: "billing", Topic: topic, Partition: control.AllPartitions,
		From: time.Now().Add(-time.Hour), FromOffset: -1, Reason: "handler fixed"}
}

var parts = []control.Part{{Partition: 0, Start: 10, End: 20}, {Partition: 1, Start: 5, End: 5}}

// TestRedriveAdmission: one re-drive runs per group and topic; each takes
// the group's next epoch unless it names an earlier one; the group's
// re-drives an hour are bounded; a window with nothing in it is refused;
// each start and cancel is audited.
func TestRedriveAdmission(t *testing.T) {
	pool := db(t)
	ctx := t.Context()
	a := control.Admin{DB: pool, MaxRedrivesPerHour: 3}
	r1, err := a.StartRedrive(ctx, "alice", request("payments"), append([]control.Part(nil), parts...))
	if err != nil {
		t.Fatal(err)
	}
	if r1.Epoch != 1 || r1.ID == 0 || !r1.Parts[1].Done {
		t.Errorf("first re-drive: %+v", r1)
	}
	if _, err := a.StartRedrive(ctx, "bob", request("payments"), parts); !errors.Is(err, control.ErrConflict) {
		t.Fatalf("a second re-drive of the topic: %v, want ErrConflict", err)
	}
	r2, err := a.StartRedrive(ctx, "bob", request("refunds"), parts)
	if err != nil || r2.Epoch != 2 {
		t.Fatalf("a re-drive of another topic: %+v, %v; want epoch 2", r2, err)
	}
	bad := request("refunds2")
	bad.Epoch = 9
	var ie *control.InputError
	if _, err := a.StartRedrive(ctx, "bob", bad, parts); !errors.As(err, &ie) || ie.Field != "epoch" {
		t.Fatalf("an epoch never used: %v, want an input error on epoch", err)
	}
	if _, err := a.StartRedrive(ctx, "bob", request("empty"), []control.Part{{Partition: 0, Start: 3, End: 3}}); !errors.As(err, &ie) {
		t.Fatalf("an empty window: %v, want an input error", err)
	}
	if _, err := a.CancelRedrive(ctx, "carol", r1.ID, "wrong window"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CancelRedrive(ctx, "carol", r1.ID, ""); !errors.Is(err, control.ErrConflict) {
		t.Fatalf("cancel twice: %v, want ErrConflict", err)
	}
	if _, err := a.CancelRedrive(ctx, "carol", 99999, ""); !errors.Is(err, control.ErrNotFound) {
		t.Fatalf("cancel of no re-drive: %v, want ErrNotFound", err)
	}
	again := request("payments")
	again.Epoch = 1
	r3, err := a.StartRedrive(ctx, "alice", again, parts)
	if err != nil || r3.Epoch != 1 {
		t.Fatalf("a re-drive under epoch 1 again: %+v, %v", r3, err)
	}
	var re *control.RateError
	if _, err := a.StartRedrive(ctx, "alice", request("more"), parts); !errors.Is(err, control.ErrRateLimited) || !errors.As(err, &re) || re.RetryAfter <= 0 {
		t.Fatalf("the fourth re-drive of the hour: %v, want ErrRateLimited with a wait", err)
	}
	if plan, err := a.Plan(ctx, "alice", request("other"), parts); !errors.Is(err, control.ErrRateLimited) {
		t.Fatalf("a dry run past the limit: %+v, %v; want ErrRateLimited", plan, err)
	}
	if n := len(audits(t, pool, "redrive")); n != 3 {
		t.Errorf("%d redrive audit rows, want 3", n)
	}
	if n := len(audits(t, pool, "redrive-cancel")); n != 1 {
		t.Errorf("%d redrive-cancel audit rows, want 1", n)
	}
	list, err := a.Redrives(ctx, "billing", 10)
	if err != nil || len(list) != 3 || list[0].ID != r3.ID || list[2].State != control.Cancelled {
		t.Fatalf("re-drives: %+v, %v", list, err)
	}
}

// TestProgressEndsTheRedrive: progress never moves back, ends a part at
// its end, and the last part's end ends the re-drive.
func TestProgressEndsTheRedrive(t *testing.T) {
	pool := db(t)
	ctx := t.Context()
	a := control.Admin{DB: pool}
	r, err := a.StartRedrive(ctx, "alice", request("payments"), []control.Part{{Partition: 0, Start: 10, End: 20}, {Partition: 1, Start: 0, End: 4}})
	if err != nil {
		t.Fatal(err)
	}
	step := func(p int32, next int64, wantDone bool) {
		t.Helper()
		done, err := control.Progress(ctx, pool, r.ID, p, next, "m1")
		if err != nil || done != wantDone {
			t.Fatalf("Progress(%d, %d) = %v, %v; want %v", p, next, done, err, wantDone)
		}
	}
	step(0, 15, false)
	step(0, 12, false) // never back
	step(1, 4, true)
	got, err := a.Redrive(ctx, r.ID)
	if err != nil || got.State != control.Running || got.Parts[0].Next != 15 || got.Parts[0].Member != "m1" {
		t.Fatalf("after some progress: %+v, %v", got, err)
	}
	step(0, 25, true) // past the end: the end
	if got, _ = a.Redrive(ctx, r.ID); got.State != control.Done || got.Parts[0].Next != 20 || got.FinishedAt.IsZero() {
		t.Fatalf("after the last part: %+v", got)
	}
}

// TestStateEpoch: a record's epoch is the highest of the re-drives whose
// window holds it, whatever their state; Active finds the running part.
func TestStateEpoch(t *testing.T) {
	s := control.State{Redrives: []control.Redrive{
		{ID: 1, Topic: "p", Epoch: 1, State: control.Done, Parts: []control.Part{{Partition: 0, Start: 100, End: 200, Next: 200, Done: true}}},
		{ID: 2, Topic: "p", Epoch: 2, State: control.Running, Parts: []control.Part{{Partition: 0, Start: 150, End: 300, Next: 160}, {Partition: 1, Start: 0, End: 5, Done: true}}},
		{ID: 3, Topic: "q", Epoch: 3, State: control.Cancelled, Parts: []control.Part{{Partition: 0, Start: 0, End: 1000}}},
	}}
	for _, c := range []struct {
		topic  string
		part   int32
		offset int64
		want   int64
	}{
		{"p", 0, 99, 0}, {"p", 0, 100, 1}, {"p", 0, 149, 1}, {"p", 0, 150, 2}, {"p", 0, 299, 2}, {"p", 0, 300, 0},
		{"p", 1, 3, 2}, {"p", 2, 3, 0}, {"q", 0, 10, 3}, {"r", 0, 10, 0},
	} {
		if got := s.Epoch(c.topic, c.part, c.offset); got != c.want {
			t.Errorf("Epoch(%s, %d, %d) = %d, want %d", c.topic, c.part, c.offset, got, c.want)
		}
	}
	if r, p, ok := s.Active("p", 0); !ok || r.ID != 2 || p.Next != 160 {
		t.Errorf("Active(p, 0) = %d %+v %v", r.ID, p, ok)
	}
	if _, _, ok := s.Active("p", 1); ok {
		t.Error("a done part is active")
	}
	if _, _, ok := s.Active("q", 0); ok {
		t.Error("a cancelled re-drive is active")
	}
}

// TestWatcherFollowsChanges: the watcher applies a change at its NOTIFY,
// long before its re-read; after its connection is killed it reconnects
// and reads what changed meanwhile; with the trigger gone, the periodic
// re-read still brings a change.
func TestWatcherFollowsChanges(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: skipped with -short")
	}
	pg := idemtest.ConnectPostgres(t)
	pool := pg.Pool
	// The watcher's own pool, named, so that its connection can be killed.
	app := "control-watcher-" + pg.Schema
	wcfg, err := pgxpool.ParseConfig(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	wcfg.ConnConfig.RuntimeParams["application_name"] = app
	wpool, err := pgxpool.NewWithConfig(t.Context(), wcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wpool.Close)
	ctx, cancel := context.WithCancel(t.Context())
	var mu sync.Mutex
	var last control.State
	reads := 0
	w := &control.Watcher{Pool: wpool, Group: "billing", Reread: time.Hour, Retry: 50 * time.Millisecond, Apply: func(s control.State) {
		mu.Lock()
		defer mu.Unlock()
		last, reads = s, reads+1
	}}
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	paused := func(p int32) func() error {
		return func() error {
			mu.Lock()
			defer mu.Unlock()
			if _, ok := last.Paused("payments", p); !ok {
				return fmt.Errorf("partition %d not paused in the watcher's state (%d reads)", p, reads)
			}
			return nil
		}
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if reads == 0 {
			return errors.New("no first read")
		}
		return nil
	})
	a := control.Admin{DB: pool}
	pause := func(p int32) {
		t.Helper()
		if _, err := a.Pause(t.Context(), "alice", control.Pause{Group: "billing", Topic: "payments", Partition: p, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	pause(0)
	idemtest.Eventually(t, 10*time.Second, paused(0)) // NOTIFY: the re-read is an hour away

	// Kill the watcher's connection; pause meanwhile (no NOTIFY: the
	// trigger is gone); the reconnection reads it.
	if _, err := pool.Exec(ctx, `DROP TRIGGER idem_control_pauses_notify ON idem_control_pauses`); err != nil {
		t.Fatal(err)
	}
	pause(1)
	var killed int
	if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = left($1, 63)`, app).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d watcher connections (%v), want 1", killed, err)
	}
	idemtest.Eventually(t, 30*time.Second, paused(1))

	// Without the trigger, only the re-read sees a change.
	cancel()
	wg.Wait()
	ctx2, cancel2 := context.WithCancel(t.Context())
	t.Cleanup(func() { cancel2(); wg.Wait() })
	w.Reread = 200 * time.Millisecond
	wg.Go(func() { w.Run(ctx2) })
	pause(2)
	idemtest.Eventually(t, 30*time.Second, paused(2))
}

// TestFleet: a beat writes a member's row, a member that misses its beats
// shows as stale, and one that leaves is gone.
func TestFleet(t *testing.T) {
	pool := db(t)
	ctx := t.Context()
	m := control.Member{Group: "billing", ID: "host-1/42/ab", Host: "host-1", Version: "v1", StartedAt: time.Now(), BeatEvery: time.Hour,
		Status: control.Status{Partitions: []control.PartitionStatus{{Topic: "payments", Partition: 0, Lag: 7, Paused: []string{"operator"}}}}}
	if err := control.Beat(ctx, pool, m); err != nil {
		t.Fatal(err)
	}
	quick := m
	quick.ID, quick.BeatEvery = "host-2/7/cd", time.Millisecond
	if err := control.Beat(ctx, pool, quick); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 10*time.Second, func() error {
		ms, err := control.Fleet(ctx, pool, "billing")
		if err != nil {
			return err
		}
		if len(ms) != 2 {
			return fmt.Errorf("%d members", len(ms))
		}
		if ms[0].Stale || ms[0].Status.Partitions[0].Lag != 7 || ms[0].Status.Partitions[0].Paused[0] != "operator" {
			return fmt.Errorf("the beating member: %+v", ms[0])
		}
		if !ms[1].Stale || ms[1].MissedBeats < control.StaleBeats {
			return fmt.Errorf("the quiet member is not stale: %+v", ms[1])
		}
		return nil
	})
	if err := control.Leave(ctx, pool, "billing", quick.ID); err != nil {
		t.Fatal(err)
	}
	if ms, err := control.Fleet(ctx, pool, ""); err != nil || len(ms) != 1 {
		t.Fatalf("after a leave: %+v, %v", ms, err)
	}
}

// TestWindow: a window by time starts at the first record at or after
// From in each partition and ends at Until, or at the end at the request;
// one by offset starts there; an unknown topic or partition is an input
// error.
func TestWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: skipped with -short")
	}
	k := idemtest.Connect(t)
	topic := k.Topic(t, "window", 2)
	base := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	cfg := k.SaramaConfig()
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Return.Successes = true
	p, err := sarama.NewSyncProducer(k.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 10 { // one a minute in each partition: offsets 0..9
		for part := range int32(2) {
			if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: part, Value: sarama.StringEncoder("x"),
				Timestamp: base.Add(time.Duration(i) * time.Minute)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	r := control.RedriveRequest{Group: "g", Topic: topic, Partition: control.AllPartitions, FromOffset: -1,
		From: base.Add(3 * time.Minute), Until: base.Add(7*time.Minute + time.Second)}
	got, err := control.Window(t.Context(), client, r)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint([]control.Part{{Partition: 0, Start: 3, End: 8, Next: 3}, {Partition: 1, Start: 3, End: 8, Next: 3}})
	if fmt.Sprint(got) != want {
		t.Errorf("window by time = %v, want %v", got, want)
	}
	r.Until = time.Time{}
	r.From = base.Add(-time.Hour)
	if got, _ = control.Window(t.Context(), client, r); got[0].Start != 0 || got[0].End != 10 {
		t.Errorf("window from before the first record to the end = %v", got)
	}
	r.From, r.FromOffset, r.Partition = time.Time{}, 6, 1
	if got, _ = control.Window(t.Context(), client, r); len(got) != 1 || got[0].Partition != 1 || got[0].Start != 6 || got[0].End != 10 {
		t.Errorf("window by offset = %v", got)
	}
	var ie *control.InputError
	r.Partition = 5
	if _, err := control.Window(t.Context(), client, r); !errors.As(err, &ie) || ie.Field != "partition" {
		t.Errorf("an unknown partition: %v", err)
	}
	r.Topic, r.Partition = topic+"-none", 0
	if _, err := control.Window(t.Context(), client, r); !errors.As(err, &ie) || ie.Field != "topic" {
		t.Errorf("an unknown topic: %v", err)
	}
}
