package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/control"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// Environment of the controls' helper process, beside the crash helper's.
const (
	controlsEnvBlockAfter = "IDEM_CONTROLS_BLOCK_AFTER" // block on the re-driven record after this many
	controlsEnvVersion    = "IDEM_CONTROLS_VERSION"     // the handler's version column
)

// newControlEnv is newEnv with the live controls' tables and a table of
// effects that says under which epoch, and by which version of the
// handler, each one was made (no unique constraint: only the inbox
// prevents doubles).
func newControlEnv(t *testing.T, partitions int32) *env {
	t.Helper()
	e := newEnv(t, partitions)
	ctx := testenv.Context(t)
	if err := control.Migrate(ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE control_effects(key text NOT NULL, part int, off bigint, epoch bigint, version text, at timestamptz DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	return e
}

// epochHandler writes one control_effects row per handled message, in its
// transaction, as version() says.
func epochHandler(version func() string) handler.Func {
	return func(ctx context.Context, m *handler.Message) error {
		o := m.Origin()
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO control_effects(key, part, off, epoch, version) VALUES ($1, $2, $3, $4, $5)`,
			m.IdempotencyKey, o.Partition, o.Offset, m.Epoch, version())
		return err
	}
}

// TestControlsHelperProcess is not a test: the controls' tests run the test
// binary again with only this function as a member of their group with
// Config.Controls (epochHandler, its version from IDEM_CONTROLS_VERSION),
// and SIGKILL it. With IDEM_CONTROLS_BLOCK_AFTER=N its handler blocks on
// the N+1st re-driven record (epoch > 0), holding its transaction open.
func TestControlsHelperProcess(t *testing.T) {
	if !testenv.InChild("TestControlsHelperProcess") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute) // the parent kills us long before
	defer cancel()
	cfg, pool := helperConfig(t, ctx, "idem-controls-helper-"+os.Getenv(crashEnvSchema))
	cfg.Controls = pool
	cfg.CommitInterval = 100 * time.Millisecond
	block := -1
	if v := os.Getenv(controlsEnvBlockAfter); v != "" {
		var err error
		if block, err = strconv.Atoi(v); err != nil {
			t.Fatal(err)
		}
	}
	eff := epochHandler(func() string { return os.Getenv(controlsEnvVersion) })
	var redriven atomic.Int64
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.Epoch > 0 && block >= 0 && redriven.Add(1) > int64(block) {
			fmt.Println("blocked")
			<-ctx.Done() // hold the transaction open until we are killed
			return ctx.Err()
		}
		return eff(ctx, m)
	})
	err := consumer.Run(consumer.WithControlsTiming(ctx, 300*time.Millisecond, 2*time.Second), cfg, h)
	t.Fatalf("controls helper: Run returned %v before it was killed", err)
}

// fleetOwner returns the fresh member of e's group that claims partition p
// of topic, and the reasons it is paused for.
func (e *env) fleetOwner(topic string, p int32) (control.Member, []string, error) {
	ms, err := control.Fleet(context.Background(), e.query, e.group)
	if err != nil {
		return control.Member{}, nil, err
	}
	for _, m := range ms {
		if m.Stale {
			continue
		}
		for _, ps := range m.Status.Partitions {
			if ps.Topic == topic && ps.Partition == p {
				return m, ps.Paused, nil
			}
		}
	}
	return control.Member{}, nil, fmt.Errorf("no fresh member claims %s/%d (members: %+v)", topic, p, ms)
}

// partEffects counts the effects of partition p.
func (e *env) partEffects(p int) int {
	return e.count(`SELECT count(*) FROM control_effects WHERE part = $1`, p)
}

// TestOperatorPauseHoldsAcrossAKill (issue 29 item 17): partition 0 is
// paused while three member processes consume; the others go on, and no
// record of partition 0 is handled, also after its owner is SIGKILLed and
// the partition moves to another member; after the resume every record of
// it is handled, each once.
func TestOperatorPauseHoldsAcrossAKill(t *testing.T) {
	t.Parallel()
	const partitions = 3
	e := newControlEnv(t, partitions)
	admin := control.Admin{DB: e.query}
	ctx := testenv.Context(t)
	if _, err := admin.Pause(ctx, "alice", control.Pause{Group: e.group, Topic: e.topic, Partition: 0, Reason: "ledger migration"}); err != nil {
		t.Fatal(err)
	}
	children := map[int]*testenv.Child{}
	for range 3 {
		c := e.startHelperProcess("TestControlsHelperProcess", controlsEnvVersion+"=v1")
		children[c.Cmd.Process.Pid] = c
	}
	e.produce(coreKeys("a", 90), partitions) // 30 a partition
	others := func(n int) func() error {
		return func() error {
			if got := e.partEffects(1) + e.partEffects(2); got < n {
				return fmt.Errorf("effects of partitions 1 and 2 = %d, waiting for %d", got, n)
			}
			return nil
		}
	}
	testenv.Eventually(t, 2*time.Minute, others(60))
	var owner control.Member
	testenv.Eventually(t, time.Minute, func() error {
		m, why, err := e.fleetOwner(e.topic, 0)
		if err != nil {
			return err
		}
		if !strings.Contains(strings.Join(why, ","), "operator") {
			return fmt.Errorf("%s claims partition 0, paused for %v", m.ID, why)
		}
		owner = m
		return nil
	})
	if n := e.partEffects(0); n != 0 {
		t.Fatalf("%d records of the paused partition were handled", n)
	}
	var victim *testenv.Child
	for pid, c := range children {
		if strings.Contains(owner.ID, "/"+strconv.Itoa(pid)+"/") {
			victim = c
		}
	}
	if victim == nil {
		t.Fatalf("no helper process is member %s", owner.ID)
	}
	t.Logf("partition 0 is held by %s; killing it", owner.ID)
	victim.Kill(t)

	// The partition moves to a survivor, which holds it too.
	e.produce(coreKeys("b", 90), partitions)
	testenv.Eventually(t, 2*time.Minute, func() error {
		m, why, err := e.fleetOwner(e.topic, 0)
		switch {
		case err != nil:
			return err
		case m.ID == owner.ID:
			return fmt.Errorf("partition 0 is still with the killed member %s", m.ID)
		case !strings.Contains(strings.Join(why, ","), "operator"):
			return fmt.Errorf("%s claims partition 0, paused for %v", m.ID, why)
		}
		t.Logf("partition 0 moved to %s, which holds it", m.ID)
		return nil
	})
	testenv.Eventually(t, 2*time.Minute, others(120))
	e.produce(coreKeys("c", 90), partitions)
	testenv.Eventually(t, 2*time.Minute, others(180))
	if n := e.partEffects(0); n != 0 {
		t.Fatalf("%d records of the paused partition were handled after its owner was killed", n)
	}

	if _, err := admin.Resume(ctx, "alice", control.Pause{Group: e.group, Topic: e.topic, Partition: 0}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, func() error {
		if n := e.partEffects(0); n < 90 {
			return fmt.Errorf("effects of partition 0 = %d after the resume, waiting for 90", n)
		}
		return nil
	})
	if n, keys := e.count(`SELECT count(*) FROM control_effects`), e.count(`SELECT count(DISTINCT key) FROM control_effects`); n != 270 || keys != 270 {
		t.Errorf("effects = %d of %d keys, want 270 of 270 (each record once)", n, keys)
	}
}

// TestOperatorPauseOfATopicHoldsItsTiers: a pause of a whole topic pauses
// its retry tier's partitions for the group too, shown as
// idem_partitions_paused{reason="operator"}: a record waiting in the tier
// is not handled until the resume.
func TestOperatorPauseOfATopicHoldsItsTiers(t *testing.T) {
	t.Parallel()
	const partitions = 2
	e := newControlEnv(t, partitions)
	cfg := e.config()
	cfg.Controls = e.pool
	cfg.Retry.Attempts = 1
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{2 * time.Second}}
	var failed atomic.Int64
	eff := epochHandler(func() string { return "v1" })
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.Attempt == 1 {
			failed.Add(1)
			return errors.New("first attempt fails: to the tier")
		}
		return eff(ctx, m)
	})
	startCtx(t, consumer.WithControlsTiming(context.Background(), 200*time.Millisecond, time.Second), cfg, h)
	operator := func() float64 {
		return metricValue(t, e, "idem_partitions_paused", map[string]string{"reason": "operator"})
	}
	e.produce(coreKeys("t", 10), partitions)
	testenv.Eventually(t, time.Minute, func() error {
		if n := failed.Load(); n < 10 {
			return fmt.Errorf("%d first attempts failed, waiting for 10", n)
		}
		return nil
	})
	admin := control.Admin{DB: e.query}
	ctx := testenv.Context(t)
	if _, err := admin.Pause(ctx, "alice", control.Pause{Group: e.group, Topic: e.topic, Partition: control.AllPartitions, Reason: "hold it all"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if v := operator(); v != 2*partitions {
			return fmt.Errorf(`idem_partitions_paused{reason="operator"} = %v, want %d (the source's partitions and the tier's)`, v, 2*partitions)
		}
		return nil
	})
	// Every tier record is due 2 s after its failure; a member that does
	// not hold the tier handles them within a few seconds. Wait for the
	// tier's end to be well past, and past their due time, then look.
	tier := e.topic + "." + e.group + ".retry.1"
	testenv.Eventually(t, 30*time.Second, func() error {
		var n int64
		for _, o := range e.endOffsets(tier, partitions) {
			n += o
		}
		if n < 10 {
			return fmt.Errorf("the tier holds %d records, waiting for 10", n)
		}
		return nil
	})
	deadline := time.Now().Add(6 * time.Second)
	testenv.Eventually(t, 30*time.Second, func() error {
		if time.Now().Before(deadline) {
			return errors.New("waiting past the tier records' due time")
		}
		return nil
	})
	if n := e.count(`SELECT count(*) FROM control_effects`); n != 0 {
		t.Fatalf("%d tier records were handled while their topic was paused", n)
	}
	if _, err := admin.Resume(ctx, "alice", control.Pause{Group: e.group, Topic: e.topic, Partition: control.AllPartitions}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, func() error {
		if n := e.count(`SELECT count(DISTINCT key) FROM control_effects`); n != 10 {
			return fmt.Errorf("%d keys handled after the resume, want 10", n)
		}
		if v := operator(); v != 0 {
			return fmt.Errorf(`idem_partitions_paused{reason="operator"} = %v after the resume`, v)
		}
		return nil
	})
}

// produceAt sends one record per key, partition i%partitions, with the
// record timestamp at(i).
func (e *env) produceAt(keys []string, partitions int, at func(i int) time.Time) {
	e.t.Helper()
	p := e.k.Producer(e.t)
	for i, k := range keys {
		_, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: int32(i % partitions), Key: sarama.StringEncoder(k),
			Value: sarama.StringEncoder(`{}`), Timestamp: at(i), Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(k)}}})
		if err != nil {
			e.t.Fatalf("produce: %v", err)
		}
	}
}

// redrive starts a re-drive of e's group and topic from from until until
// (zero: the end; epoch 0: a new one).
func (e *env) redrive(client sarama.Client, from, until time.Time, epoch int64, rate int) control.Redrive {
	e.t.Helper()
	ctx := testenv.Context(e.t)
	admin := control.Admin{DB: e.query, MaxRedrivesPerHour: 100}
	req := control.RedriveRequest{Group: e.group, Topic: e.topic, Partition: control.AllPartitions, From: from, Until: until, FromOffset: -1,
		Epoch: epoch, Rate: rate, Reason: "handler fixed"}
	parts, err := control.Window(ctx, client, req)
	if err != nil {
		e.t.Fatal(err)
	}
	rd, err := admin.StartRedrive(ctx, "alice", req, parts)
	if err != nil {
		e.t.Fatal(err)
	}
	return rd
}

// waitRedrive waits until re-drive id is done.
func (e *env) waitRedrive(id int64, timeout time.Duration) control.Redrive {
	e.t.Helper()
	var rd control.Redrive
	testenv.Eventually(e.t, timeout, func() error {
		var err error
		if rd, err = (control.Admin{DB: e.query}).Redrive(context.Background(), id); err != nil {
			return err
		}
		if rd.State != control.Done {
			total, done := rd.Offsets()
			return fmt.Errorf("re-drive %d is %s: %d of %d offsets", id, rd.State, done, total)
		}
		return nil
	})
	return rd
}

func (e *env) client() sarama.Client {
	e.t.Helper()
	c, err := sarama.NewClient(e.k.Brokers, e.k.SaramaConfig())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestRedriveRunsEachKeyOnceMore (issue 29 item 18): after a handler bug,
// a re-drive of the last hour (by the producer's record timestamps) runs
// each key of the window once more, under its epoch, with the fixed
// handler, and no key outside it; a record of a window key written after
// the window's end is a duplicate as usual; a second re-drive under the
// same epoch does nothing.
func TestRedriveRunsEachKeyOnceMore(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"", "batch", "lanes", "lanes-batch", "txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		const partitions = 2
		e := newControlEnv(t, partitions).in(mode)
		now := time.Now()
		e.produceAt(coreKeys("old", 20), partitions, func(i int) time.Time { return now.Add(-2*time.Hour + time.Duration(i)*time.Minute) })
		e.produceAt(coreKeys("new", 20), partitions, func(i int) time.Time { return now.Add(-50*time.Minute + time.Duration(i)*time.Minute) })
		var version atomic.Value
		version.Store("buggy")
		cfg := e.config()
		cfg.Controls = e.pool
		startCtx(t, consumer.WithControlsTiming(context.Background(), 200*time.Millisecond, time.Second), cfg,
			epochHandler(func() string { return version.Load().(string) }))
		testenv.Eventually(t, time.Minute, func() error {
			if n := e.count(`SELECT count(*) FROM control_effects`); n != 40 {
				return fmt.Errorf("effects = %d, waiting for 40", n)
			}
			return nil
		})
		version.Store("fixed") // the handler's fix is deployed

		client := e.client()
		rd := e.redrive(client, now.Add(-time.Hour), now, 0, 0)
		if total, _ := rd.Offsets(); total != 20 || rd.Epoch != 1 {
			t.Fatalf("the window holds %d offsets under epoch %d, want the 20 records of the last hour under epoch 1", total, rd.Epoch)
		}
		e.waitRedrive(rd.ID, 2*time.Minute)
		if n, keys := e.count(`SELECT count(*) FROM control_effects WHERE epoch = 1 AND version = 'fixed' AND key LIKE 'new-%'`),
			e.count(`SELECT count(DISTINCT key) FROM control_effects WHERE epoch = 1`); n != 20 || keys != 20 {
			t.Errorf("epoch 1 effects: %d of the window's keys by the fixed handler, %d keys; want 20 and 20", n, keys)
		}
		if n := e.count(`SELECT count(*) FROM control_effects WHERE key LIKE 'old-%'`); n != 20 {
			t.Errorf("keys outside the window: %d effects, want their 20 first ones only", n)
		}

		// Past the window's end: a copy of a window key is a duplicate as
		// usual, a new key runs once.
		e.produceAt([]string{"new-3", "late-0"}, partitions, func(int) time.Time { return time.Now() })
		testenv.Eventually(t, time.Minute, func() error {
			if n := e.count(`SELECT count(*) FROM control_effects WHERE key = 'late-0'`); n != 1 {
				return fmt.Errorf("late-0 has %d effects, waiting for 1", n)
			}
			return nil
		})
		e.waitCommitted(e.topic, partitions, time.Minute)

		// The same window under the same epoch again: nothing runs.
		again := e.redrive(client, now.Add(-time.Hour), now, rd.Epoch, 0)
		e.waitRedrive(again.ID, 2*time.Minute)
		if n := e.count(`SELECT count(*) FROM control_effects`); n != 40+20+1 {
			t.Errorf("effects = %d after a second re-drive under epoch %d and a late copy, want %d", n, rd.Epoch, 40+20+1)
		}
		if v := metricValue(t, e, "idem_partitions_paused", map[string]string{"reason": "redrive"}); v != 0 {
			t.Errorf(`idem_partitions_paused{reason="redrive"} = %v after the re-drives`, v)
		}
	})
}

// TestRedriveSurvivesACrash (issue 29 item 18): the member re-driving a
// partition is SIGKILLed in the middle (its handler holding a
// transaction); the progress it recorded stays, and the member that takes
// the partition next goes on from it: every key of the window ends with
// exactly one effect under the epoch.
func TestRedriveSurvivesACrash(t *testing.T) {
	t.Parallel()
	const total, blockAfter = 60, 30
	e := newControlEnv(t, 1)
	e.produceAt(coreKeys("k", total), 1, func(i int) time.Time { return time.Now().Add(-30 * time.Minute) })
	cfg := e.config()
	cfg.Controls = e.pool
	first := startCtx(t, consumer.WithControlsTiming(context.Background(), 200*time.Millisecond, time.Second), cfg,
		epochHandler(func() string { return "v1" }))
	e.waitCommitted(e.topic, 1, time.Minute)
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}

	child := e.startHelperProcess("TestControlsHelperProcess", controlsEnvVersion+"=crashed", controlsEnvBlockAfter+"="+strconv.Itoa(blockAfter))
	rd := e.redrive(e.client(), time.Now().Add(-time.Hour), time.Time{}, 0, 20) // 20 a second: progress is recorded on the way
	if _, err := child.WaitForWithin(2*time.Minute, func(line string) bool { return strings.Contains(line, "blocked") }); err != nil {
		t.Fatalf("the helper did not block on a re-driven record: %v", err)
	}
	testenv.Eventually(t, time.Minute, func() error {
		p, _, err := control.PartOf(context.Background(), e.query, rd.ID, 0)
		if err != nil {
			return err
		}
		if p.Next == p.Start {
			return errors.New("no progress recorded yet")
		}
		return nil
	})
	child.Kill(t)
	testenv.Eventually(t, time.Minute, func() error { // a COMMIT sent before the kill may still land
		if n := e.count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = left($1, 63)`, "idem-controls-helper-"+e.coreSchema()); n > 0 {
			return fmt.Errorf("%d sessions of the killed helper still open", n)
		}
		return nil
	})
	atKill := e.count(`SELECT count(*) FROM control_effects WHERE epoch = $1`, rd.Epoch)
	p, _, err := control.PartOf(context.Background(), e.query, rd.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("at the kill: %d re-driven effects, progress %d of %d-%d", atKill, p.Next, p.Start, p.End)
	if atKill != blockAfter || p.Next <= p.Start || p.Next-p.Start > int64(atKill) {
		t.Fatalf("at the kill: %d effects under the epoch, progress %d from %d; want %d effects and a progress behind them", atKill, p.Next, p.Start, blockAfter)
	}

	startCtx(t, consumer.WithControlsTiming(context.Background(), 200*time.Millisecond, time.Second), cfg, epochHandler(func() string { return "v2" }))
	e.waitRedrive(rd.ID, 2*time.Minute)
	if n, keys := e.count(`SELECT count(*) FROM control_effects WHERE epoch = $1`, rd.Epoch), e.count(`SELECT count(DISTINCT key) FROM control_effects WHERE epoch = $1`, rd.Epoch); n != total || keys != total {
		t.Errorf("effects under the epoch = %d of %d keys, want %d of %d (each key once, across the crash)", n, keys, total, total)
	}
	if n := e.count(`SELECT count(*) FROM control_effects WHERE epoch = 0`); n != total {
		t.Errorf("epoch 0 effects = %d, want %d", n, total)
	}
}

// TestRedriveCoversRecordsNotReachedYet: records of a window that the group
// had not handled when the re-drive was asked (its member was down) are
// handled once, under the re-drive's epoch, and never under epoch 0: the
// re-drive reads them, and the live flow, which reaches them after, finds
// them done in the epoch.
func TestRedriveCoversRecordsNotReachedYet(t *testing.T) {
	t.Parallel()
	e := newControlEnv(t, 1)
	e.produceAt(coreKeys("seen", 10), 1, func(int) time.Time { return time.Now() })
	cfg := e.config()
	cfg.Controls = e.pool
	timing := consumer.WithControlsTiming(context.Background(), 200*time.Millisecond, time.Second)
	first := startCtx(t, timing, cfg, epochHandler(func() string { return "v1" }))
	e.waitCommitted(e.topic, 1, time.Minute)
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	e.produceAt(coreKeys("unseen", 10), 1, func(int) time.Time { return time.Now() })
	rd := e.redrive(e.client(), time.Now().Add(-time.Hour), time.Time{}, 0, 0)
	if total, _ := rd.Offsets(); total != 20 {
		t.Fatalf("the window holds %d offsets, want 20", total)
	}
	startCtx(t, timing, cfg, epochHandler(func() string { return "v2" }))
	e.waitRedrive(rd.ID, 2*time.Minute)
	e.waitCommitted(e.topic, 1, time.Minute)
	if n := e.count(`SELECT count(*) FROM control_effects WHERE key LIKE 'unseen-%' AND epoch = 0`); n != 0 {
		t.Errorf("%d records the group had not reached ran under epoch 0 too", n)
	}
	if n, keys := e.count(`SELECT count(*) FROM control_effects WHERE epoch = $1`, rd.Epoch), e.count(`SELECT count(DISTINCT key) FROM control_effects WHERE epoch = $1`, rd.Epoch); n != 20 || keys != 20 {
		t.Errorf("effects under the epoch = %d of %d keys, want 20 of 20", n, keys)
	}
}
