package consumer_test

// Crossing tests of issue 28 ("Prove every crossing"): Transactions crossed
// with Ordering, hooks, graceful stops and faults. Each names the defect it
// was written for; each failed before its fix.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/schema"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
)

// crossEnvSeed reruns a crossing test with the seed a failing run logged.
const crossEnvSeed = "IDEM_CROSS_SEED"

// crossRand returns the random source a crossing test draws its crossing
// from, seeded by IDEM_CROSS_SEED or the clock; the seed is logged, so a
// failing draw reruns exactly.
func crossRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(crossEnvSeed); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", crossEnvSeed, s, err)
		}
		seed = n
	}
	t.Logf("seed %d (rerun: %s=%d go test -run '%s' ./consumer/)", seed, crossEnvSeed, seed, t.Name())
	return rand.New(rand.NewPCG(seed, seed>>1|1))
}

// ikeyOf is the idempotency key a forwarded record carries.
func ikeyOf(rec forward.Record) string {
	for _, h := range rec.Headers {
		if string(h.Key) == wire.HeaderIdempotencyKey {
			return string(h.Value)
		}
	}
	return ""
}

// runHandle is a Run the test starts and may stop from one of Run's own
// hooks (set once the Run exists).
type runHandle struct {
	mu sync.Mutex
	r  *running
}

func (h *runHandle) set(r *running) {
	h.mu.Lock()
	h.r = r
	h.mu.Unlock()
}

// cancel stops the Run as a SIGTERM does: its ctx is cancelled.
func (h *runHandle) cancel() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.r.cancel()
}

// drainedKeys produces H then parked on partition 0 under Kafka key K: H
// fails once (tier 1), the parked messages wait behind it.
func (e *env) drainedKeys(parked ...string) {
	e.t.Helper()
	p := e.k.Producer(e.t)
	for _, ik := range append([]string{"H"}, parked...) {
		e.send(p, 0, []byte("K"), ik)
	}
}

// drainStop stops a Run as a SIGTERM does once its drain reaches a given
// parked message, before that message is handled.
type drainStop struct {
	run     runHandle
	stopped atomic.Bool
}

// ctx returns a ctx for the Run whose drain hook stops it at ikey.
func (d *drainStop) ctx(t *testing.T, ikey string) context.Context {
	return consumer.WithOrderHooks(testenv.Context(t), nil, func(stop, _ context.Context, rec keyorder.Record) {
		if rec.IdempotencyKey == ikey && d.stopped.CompareAndSwap(false, true) {
			d.run.cancel() // SIGTERM mid-drain
			<-stop.Done()
		}
	})
}

// wait waits until the drain reached the message and the Run ended.
func (d *drainStop) wait(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() error {
		if !d.stopped.Load() {
			return errors.New("the drain has not reached the message to stop at")
		}
		return nil
	})
	if err := d.run.r.stop(); err != nil {
		t.Fatal(err)
	}
}

// drainHandler fails H once (retriably: it goes to tier 1 and the later
// messages of its key park behind it), D… for good, and applies the rest.
func drainHandler(c *calls) handler.Func {
	return func(ctx context.Context, m *handler.Message) error {
		n := c.inc(m.IdempotencyKey)
		switch {
		case m.IdempotencyKey == "H" && n == 1:
			return errors.New("H fails once")
		case strings.HasPrefix(m.IdempotencyKey, "D"):
			return handler.Permanent(errors.New("dead"))
		}
		return apply(ctx, m)
	}
}

// checkOnceInDLQ checks that a read_committed reader sees each of ikeys
// once in the DLQ.
func (e *env) checkOnceInDLQ(ikeys ...string) {
	e.t.Helper()
	got := e.ikeyCopies(e.dlq())
	for _, ik := range ikeys {
		if got[ik] != 1 {
			e.t.Errorf("%s: %d DLQ copies for a read_committed reader, want 1 (all: %v)", ik, got[ik], got)
		}
	}
}

// attentionHook is an OnDeadLettered that writes the message's key to the
// attention table (created here) in the inbox's transaction, and fails,
// counting in fails, while down says so for the message.
func (e *env) attentionHook(down func(d consumer.DeadLettered) bool, fails *atomic.Int32) func(ctx context.Context, d consumer.DeadLettered) error {
	e.t.Helper()
	if _, err := e.pool.Exec(testenv.Context(e.t), `CREATE TABLE attention(key text)`); err != nil {
		e.t.Fatal(err)
	}
	return func(ctx context.Context, d consumer.DeadLettered) error {
		if down(d) {
			fails.Add(1)
			return errors.New("the hook's dependency is down")
		}
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO attention VALUES ($1)`, d.Message.IdempotencyKey)
		return err
	}
}

// Defect 1 (a drain's forward): the head H settles and its drain
// dead-letters the first parked messages; the member is then stopped
// gracefully (Run's ctx cancelled) before the drain reaches S. The
// forwards must not commit without H's offset: the next member drains
// again, and a read_committed reader must see each dead-lettered message
// once.
func TestCrossingStopAfterDrainForward(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		rng := crossRand(t)
		e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
		e.in(mode)
		cfg = mode.apply(cfg)
		var dead []string
		for i := range 1 + rng.IntN(3) {
			dead = append(dead, fmt.Sprintf("D%d", i))
		}
		var ds drainStop
		var c calls
		e.drainedKeys(append(dead, "S")...)
		ds.run.set(startCtx(t, ds.ctx(t, "S"), cfg, drainHandler(&c)))
		ds.wait(t)
		cfg.Registerer = prometheus.NewRegistry()
		r := start(t, cfg, drainHandler(&c))
		e.waitSettled("H,S")
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		e.checkOnceInDLQ(dead...)
	})
}

// Defect 1 (a failing OnDeadLettered hook): X is dead-lettered and its hook
// fails while the member is stopped gracefully. X's forward must not commit
// without X's offset: a read_committed reader sees X once in the DLQ, and
// the hook runs once, after its DLQ record committed.
func TestCrossingStopInFailingDeadLetterHook(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1).in(mode)
		var failing atomic.Bool
		failing.Store(true)
		var fails atomic.Int32
		cfg := e.config()
		cfg.OnDeadLettered = e.attentionHook(func(consumer.DeadLettered) bool { return failing.Load() }, &fails)
		eff := effectHandler()
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			if m.IdempotencyKey == "X" {
				return handler.Permanent(errors.New("X is poison"))
			}
			return eff(ctx, m)
		})
		e.produce([]string{"A", "X", "B"}, 1)
		first := start(t, cfg, h)
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := fails.Load(); n < 2 {
				return fmt.Errorf("the hook failed %d times", n)
			}
			return nil
		})
		if err := first.stop(); err != nil { // SIGTERM while the hook fails
			t.Fatal(err)
		}
		failing.Store(false)
		cfg.Registerer = prometheus.NewRegistry()
		r := start(t, cfg, h)
		e.waitCommitted(e.topic, 1, 60*time.Second)
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM attention`); n != 1 {
				return fmt.Errorf("%d hook rows, want 1", n)
			}
			return nil
		})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		e.checkOnceInDLQ("X")
		if n := e.count(`SELECT count(*) FROM effects`); n != 2 {
			t.Errorf("%d effects, want 2 (A and B)", n)
		}
	})
}

// Defect 1 (a later forward failing before it is sent): H's drain
// dead-letters D0, then D1's forward fails before it reaches the broker
// (an outage) until the member is stopped gracefully. D0's forward must not
// commit without H's offset: a read_committed reader sees each once.
func TestCrossingStopAfterLaterForwardFails(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
		e.in(mode)
		cfg = mode.apply(cfg)
		var faulting atomic.Bool
		faulting.Store(true)
		var faults atomic.Int32
		var firstFault atomic.Int64
		ctx := consumer.WithSendFault(testenv.Context(t), func(rec forward.Record) error {
			if ikeyOf(rec) != "D1" || !faulting.Load() {
				return nil
			}
			if faults.Add(1) == 1 {
				firstFault.Store(time.Now().UnixNano())
			}
			return &forward.ForwardError{Topic: rec.Topic, Partition: -1, Err: sarama.ErrLeaderNotAvailable}
		})
		var c calls
		e.drainedKeys("D0", "D1", "S")
		first := startCtx(t, ctx, cfg, drainHandler(&c))
		// Long enough for commits to run while D1's forward waits.
		testenv.Eventually(t, 60*time.Second, func() error {
			if n, at := faults.Load(), firstFault.Load(); n < 3 || time.Since(time.Unix(0, at)) < 2*time.Second {
				return fmt.Errorf("D1's forward failed %d times", n)
			}
			return nil
		})
		if err := first.stop(); err != nil {
			t.Fatal(err)
		}
		faulting.Store(false)
		cfg.Registerer = prometheus.NewRegistry()
		r := start(t, cfg, drainHandler(&c))
		e.waitSettled("H,S")
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		e.checkOnceInDLQ("D0", "D1")
	})
}

// Defect 2 (Commit waits on the gate): while a parked message of partition
// 0 runs long inside its head's drain, after the drain dead-lettered D0,
// partition 1's messages must still commit: their offsets and Y's forward.
func TestCrossingCommitNotBehindDrain(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 2, 200*time.Millisecond)
		e.in(mode)
		cfg = mode.apply(cfg)
		release := make(chan struct{})
		var releaseOnce sync.Once
		t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
		var slowIn atomic.Bool
		var c calls
		dh := drainHandler(&c)
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			switch m.IdempotencyKey {
			case "SLOW":
				slowIn.Store(true)
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			case "Y":
				c.inc("Y")
				return handler.Permanent(errors.New("Y is poison"))
			}
			return dh(ctx, m)
		})
		e.drainedKeys("D0", "SLOW")
		r := start(t, cfg, h)
		testenv.Eventually(t, 60*time.Second, func() error {
			if !slowIn.Load() {
				return errors.New("SLOW is not running yet")
			}
			return nil
		})
		p := e.k.Producer(t)
		e.send(p, 1, []byte("other"), "Y")
		e.send(p, 1, []byte("other"), "Z")
		testenv.Eventually(t, 30*time.Second, func() error {
			if got := e.committed(e.topic, 2)[1]; got != 2 {
				return fmt.Errorf("partition 1 committed %d, want 2 while SLOW runs", got)
			}
			return nil
		})
		releaseOnce.Do(func() { close(release) })
		e.waitSettled("H,SLOW,Z", "H,Z,SLOW", "Z,H,SLOW")
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		e.checkOnceInDLQ("D0", "Y")
	})
}

// Defect 2 (a parked message outlasting Transactions.Timeout): H's drain
// dead-letters D0, then SLOW runs longer than the transaction timeout
// (plus the coordinator's 10 s sweep of timed-out transactions) and is
// dead-lettered too. The drain's transaction must not stay open across
// SLOW's handling, or the coordinator aborts it and every round aborts
// again.
func TestCrossingSlowParkedOutlastsTxnTimeout(t *testing.T) {
	t.Parallel()
	e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
	cfg = testMode("txn").apply(cfg)
	cfg.Transactions.Timeout = 2 * time.Second
	var c calls
	dh := drainHandler(&c)
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.IdempotencyKey == "SLOW" {
			c.inc("SLOW")
			select { // a slow dependency, every time
			case <-time.After(12500 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			return handler.Permanent(errors.New("SLOW is poison"))
		}
		return dh(ctx, m)
	})
	e.drainedKeys("D0", "SLOW", "S")
	r := start(t, cfg, h)
	testenv.Eventually(t, 75*time.Second, func() error {
		if n := e.orderingRows(); n != 0 {
			return fmt.Errorf("%d ordering rows left (SLOW handled %d times)", n, c.get("SLOW"))
		}
		if got := e.committed(e.tier(1), 1)[0]; got < 1 { // H is tier 1's first record
			return fmt.Errorf("tier 1 committed %d, want past H (SLOW handled %d times)", got, c.get("SLOW"))
		}
		return nil
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got := e.applied(); got != "H,S" {
		t.Errorf("applied %q, want H,S", got)
	}
	e.checkOnceInDLQ("D0", "SLOW")
}

// Defect 2 (a hook that always fails): X's OnDeadLettered fails on every
// try. Only X's partition may wait for it: partition 1's offsets and
// forwards must commit meanwhile, and X's own forward and offset too. Once
// the hook works again it runs once.
func TestCrossingFailingHookWedgesOnlyItsPartition(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		e := newEnv(t, 2).in(mode)
		var broken atomic.Bool
		broken.Store(true)
		var fails atomic.Int32
		cfg := e.config()
		cfg.OnDeadLettered = e.attentionHook(func(d consumer.DeadLettered) bool { return d.Message.IdempotencyKey == "X" && broken.Load() }, &fails)
		eff := effectHandler()
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			if m.IdempotencyKey == "X" || m.IdempotencyKey == "Y" {
				return handler.Permanent(errors.New("poison"))
			}
			return eff(ctx, m)
		})
		e.produce([]string{"X"}, 1) // partition 0
		r := start(t, cfg, h)
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := fails.Load(); n < 1 {
				return errors.New("X's hook has not failed yet")
			}
			return nil
		})
		p := e.k.Producer(t)
		e.send(p, 1, []byte("k1"), "Y")
		e.send(p, 1, []byte("k1"), "Z")
		testenv.Eventually(t, 30*time.Second, func() error {
			got := e.committed(e.topic, 2)
			if got[1] != 2 || got[0] != 1 {
				return fmt.Errorf("committed %v, want partition 0 at 1 and partition 1 at 2 while X's hook fails (%d fails)", got, fails.Load())
			}
			return nil
		})
		broken.Store(false)
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM attention`); n != 2 {
				return fmt.Errorf("%d hook rows, want 2", n)
			}
			return nil
		})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		e.checkOnceInDLQ("X", "Y")
		if n := e.count(`SELECT count(*) FROM attention WHERE key='X'`); n != 1 {
			t.Errorf("X's hook ran %d times, want 1", n)
		}
	})
}

// Defect 3: a fatal error (the producer fenced by a second producer of
// the same transactional.id) while another partition's forward is about
// to send on the same producer. The producer must not be closed under that
// send (sarama panics: send on closed channel); the member starts a new
// producer and each record reaches the DLQ once.
func TestCrossingFatalWhileAnotherForwardSends(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	cfg := txnConfig(e.config(), "fenced-member")
	id := consumer.TransactionalIDOf(cfg)
	bIn := make(chan struct{})
	var aOnce, bOnce sync.Once
	ctx := consumer.WithBeforeSendHook(testenv.Context(t), func(rec forward.Record, failed func() <-chan struct{}) {
		switch {
		case rec.Partition == 0:
			aOnce.Do(func() {
				select { // B is inside the owner, past its checks
				case <-bIn:
				case <-time.After(10 * time.Second):
				}
				fence(t, e, id)
			})
		case rec.Partition == 1:
			bOnce.Do(func() {
				close(bIn)
				select { // A's send failed for good meanwhile
				case <-failed():
				case <-time.After(10 * time.Second):
				}
			})
		}
	})
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		return handler.Permanent(errors.New("poison"))
	})
	e.produce([]string{"A", "B"}, 2)
	r := startCtx(t, ctx, cfg, h)
	e.waitCommitted(e.topic, 2, 90*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.checkOnceInDLQ("A", "B")
}

// fence makes a transactional producer with id, which fences the member's
// (InitProducerId bumps the epoch), and closes it.
func fence(t *testing.T, e *env, id string) {
	scfg := e.k.SaramaConfig()
	scfg.Version = sarama.V4_1_0_0
	scfg.Producer.Idempotent = true
	scfg.Producer.RequiredAcks = sarama.WaitForAll
	scfg.Net.MaxOpenRequests = 1
	scfg.Producer.Return.Successes = true
	scfg.Producer.Transaction.ID = id
	p, err := sarama.NewSyncProducer(e.k.Brokers, scfg)
	if err != nil {
		t.Errorf("fencing producer %q: %v", id, err)
		return
	}
	_ = p.Close()
}

// Defect 4: X is dead-lettered and its OnDeadLettered hook configured, and
// the transaction holding X's DLQ record aborts; X's redelivery succeeds.
// X was never dead-lettered for a read_committed reader, so its hook must
// not have run.
func TestCrossingHookOnlyForCommittedDeadLetter(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1).in(mode)
		var aborted atomic.Bool
		ctx := consumer.WithBeforeCommitHook(testenv.Context(t), func(records int) error {
			if records > 0 && aborted.CompareAndSwap(false, true) {
				return errors.New("forced abort of the transaction holding X's DLQ record")
			}
			return nil
		})
		cfg := e.config()
		cfg.OnDeadLettered = e.attentionHook(func(consumer.DeadLettered) bool { return false }, nil)
		var c calls
		eff := effectHandler()
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			if m.IdempotencyKey == "X" && c.inc("X") == 1 {
				return handler.Permanent(errors.New("X fails on its first delivery"))
			}
			return eff(ctx, m)
		})
		e.produce([]string{"A", "X", "B"}, 1)
		r := startCtx(t, ctx, cfg, h)
		e.waitCommitted(e.topic, 1, 60*time.Second)
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		if !aborted.Load() {
			t.Fatal("no transaction was aborted")
		}
		if n := e.count(`SELECT count(*) FROM effects WHERE key='X'`); n != 1 {
			t.Errorf("X applied %d times, want 1 (its redelivery succeeds)", n)
		}
		if got := e.ikeyCopies(e.dlq()); got["X"] != 0 {
			t.Errorf("X has %d DLQ copies for a read_committed reader, want 0", got["X"])
		}
		if n := e.count(`SELECT count(*) FROM attention`); n != 0 {
			t.Errorf("OnDeadLettered ran %d times for X, which was never dead-lettered for a read_committed reader", n)
		}
	})
}

// Defect 5 (a later send under the transaction's lastError): A is refused
// for good by the dead-letter topic (too large for it) while the forwards
// of B1…B5 to their tier are on their way. sarama fails every send queued
// behind a refused one in the transaction with its error (its lastError),
// so a B's send failed with A's MESSAGE_TOO_LARGE, and that B was blamed:
// its next try skipped its tier. Each B must reach tier 1 once, and A the
// DLQ once, as a stub.
func TestCrossingRefusalBlamedOnItsOwnRecord(t *testing.T) {
	t.Parallel()
	const bs = 5
	e := newEnv(t, 1+bs)
	small := "10000"
	if err := e.k.Admin(t).CreateTopic(e.dlq(), &sarama.TopicDetail{NumPartitions: 1 + bs, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"max.message.bytes": &small}}, false); err != nil {
		t.Fatal(err)
	}
	e.k.WaitTopic(t, e.dlq(), 1+bs)
	// Line the sends up: every B is inside the owner before A sends, and
	// the Bs send once the producer has taken A, so they queue behind A's
	// request. Each wait gives up after 2 s (well within the transaction's
	// timeout), as it must once sends are one at a time.
	var in atomic.Int32
	allIn, aTaken := make(chan struct{}), make(chan struct{})
	var aOnce, takenOnce sync.Once
	var bOnce sync.Map
	wait := func(ch chan struct{}) {
		select {
		case <-ch:
		case <-time.After(2 * time.Second):
		}
	}
	ctx := consumer.WithBeforeSendHook(testenv.Context(t), func(rec forward.Record, _ func() <-chan struct{}) {
		ik := ikeyOf(rec)
		switch {
		case ik == "A":
			aOnce.Do(func() { wait(allIn) })
		case strings.HasPrefix(ik, "B"):
			if _, again := bOnce.LoadOrStore(ik, true); again {
				return
			}
			if in.Add(1) == bs {
				close(allIn)
			}
			wait(aTaken)
		}
	})
	ctx = consumer.WithDispatchHook(ctx, func(msg *sarama.ProducerMessage) {
		for _, h := range msg.Headers {
			if string(h.Key) == wire.HeaderIdempotencyKey && string(h.Value) == "A" {
				takenOnce.Do(func() { close(aTaken) })
			}
		}
	})
	cfg := txnConfig(e.config(), "")
	eff := effectHandler()
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		switch {
		case m.IdempotencyKey == "A":
			return handler.Permanent(errors.New("A is poison"))
		case strings.HasPrefix(m.IdempotencyKey, "B") && m.Topic == e.topic: // every time: each B goes to tier 1
			return errors.New("B fails at its source")
		}
		return eff(ctx, m)
	})
	p := e.bigProducer()
	send := func(part int32, ikey string, value []byte) {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: part, Key: sarama.StringEncoder(ikey),
			Value: sarama.ByteEncoder(value), Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(ikey)}}}); err != nil {
			t.Fatal(err)
		}
	}
	send(0, "A", make([]byte, 20000))
	var want []string
	for i := range bs {
		want = append(want, fmt.Sprintf("B%d", i+1))
		send(int32(i+1), want[i], []byte(`{}`))
	}
	r := startCtx(t, ctx, cfg, h)
	e.waitCommitted(e.topic, 1+bs, 90*time.Second)
	testenv.Eventually(t, 60*time.Second, func() error { // each B applied, or dead-lettered (blamed)
		if n, dl := e.count(`SELECT count(*) FROM effects`), coreOutcome(t, e.reg, coremetrics.OutcomeDeadLettered); n+dl < 1+bs {
			return fmt.Errorf("%d of %d Bs applied, %d messages dead-lettered", n, bs, dl)
		}
		return nil
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	tier := e.ikeyCopies(e.tier(1))
	for _, ik := range want {
		if tier[ik] != 1 {
			t.Errorf("%s: %d copies in tier 1 for a read_committed reader, want 1 (blamed for A's refusal, it skipped its tier)", ik, tier[ik])
		}
	}
	dlq := e.records(e.dlq(), sarama.ReadCommitted)
	if len(dlq) != 1 || header(dlq[0], wire.HeaderIdempotencyKey) != "A" || dlq[0].Value != nil {
		var got []string
		for _, m := range dlq {
			got = append(got, fmt.Sprintf("%s (%d bytes)", header(m, wire.HeaderIdempotencyKey), len(m.Value)))
		}
		t.Errorf("DLQ for a read_committed reader: %v, want A once, as a stub", got)
	}
}

// Defect 7: M is parked behind H, and the transaction carrying M's offset
// aborts; M's deadline passes before M is read again. Its redelivered copy
// must be skipped as parked (the ordering store holds M), not dead-lettered
// on the spot: M's parked row is dead-lettered when its turn comes, and a
// read_committed reader sees one DLQ copy of M.
func TestCrossingExpiredCopyOfParkedMessage(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		// H's tier delay (5 s) outlasts M's deadline (3 s): H, and with it the
		// drain of M, never comes back while M is live. With 200 ms, on a
		// loaded machine the commit of H's offset could come before M was
		// parked, H came back and its drain applied M, live, before any
		// commit aborted ("applied H,M").
		e, cfg := orderedEnv(t, 1, 5*time.Second)
		e.in(mode)
		cfg = mode.apply(cfg)
		deadline := time.Now().Add(3 * time.Second)
		var aborted atomic.Bool
		ctx := consumer.WithBeforeCommitHook(testenv.Context(t), func(int) error {
			if aborted.Load() || e.count(`SELECT count(*) FROM idem_ordering_parked`) == 0 {
				return nil
			}
			aborted.Store(true)
			select { // M is read again once its deadline has passed
			case <-time.After(time.Until(deadline) + 500*time.Millisecond):
			case <-t.Context().Done():
			}
			return errors.New("forced abort of the transaction carrying M's offset")
		})
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			if m.IdempotencyKey == "H" && m.Topic == e.topic {
				return errors.New("H fails at its source")
			}
			return apply(ctx, m)
		})
		e.produceExpiry(expiryRec{ikey: "H", kafkaKey: "K"}, expiryRec{ikey: "M", kafkaKey: "K", deadline: strconv.FormatInt(deadline.UnixMilli(), 10)})
		r := startCtx(t, ctx, cfg, h)
		e.waitSettled("H")
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		if !aborted.Load() {
			t.Fatal("no transaction was aborted")
		}
		e.checkOnceInDLQ("M")
	})
}

// Defect 10: two groups' members whose transactional ids collided under
// "idem-<group>-<instance>" (group G with instance eu-1, group G-eu with
// instance 1) run side by side. Each must keep its own producer: neither
// fences the other, no transaction fails, and both groups read everything.
func TestCrossingGroupsDoNotFenceEachOther(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(coreKeys("k", 50), 1)
	var logs logBuffer
	run := func(group, instance string) *running {
		cfg := txnConfig(e.config(), instance)
		cfg.Group = group
		cfg.Registerer = prometheus.NewRegistry()
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		return start(t, cfg, handler.Func(func(context.Context, *handler.Message) error { return nil }))
	}
	other := e.group + "-eu"
	t.Cleanup(func() { _ = e.k.Admin(t).DeleteConsumerGroup(other) })
	a, b := run(e.group, "eu-1"), run(other, "1")
	testenv.Eventually(t, 90*time.Second, func() error {
		for _, g := range []string{e.group, other} {
			resp, err := e.k.Admin(t).ListConsumerGroupOffsets(g, map[string][]int32{e.topic: {0}})
			if err != nil {
				return err
			}
			if got := resp.Blocks[e.topic][0].Offset; got != 50 {
				return fmt.Errorf("group %s committed %d of 50", g, got)
			}
		}
		return nil
	})
	for _, r := range []*running{a, b} {
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "Kafka transaction failed"); n > 0 {
		t.Errorf("%d transactions failed (the two members fenced each other); the log:\n%s", n, logs.String())
	}
}

// TestOwedHookHelperProcess is not a test: TestCrossingOwedHookAcrossCrash
// runs the test binary again with only this function. It consumes with
// Transactions and an OnDeadLettered that SIGKILLs the process on its first
// call: the dead-letter records and their offsets have committed, the hooks
// have not run. Outside that child it returns at once.
func TestOwedHookHelperProcess(t *testing.T) {
	if !testenv.InChild("TestOwedHookHelperProcess") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // the parent kills us long before
	defer cancel()
	cfg, _ := helperConfig(t, ctx, "idem-owed-hook-helper")
	cfg = txnConfig(cfg, "owed-hook-member")
	cfg.OnDeadLettered = func(context.Context, consumer.DeadLettered) error {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	err := consumer.Run(ctx, cfg, handler.Func(func(context.Context, *handler.Message) error {
		return handler.Permanent(errors.New("poison"))
	}))
	t.Fatalf("owed hook helper: Run returned %v before it was killed", err)
}

// Defect 4's crash guard, and the earlier item "give the hook the origin":
// a member dies after the transaction carrying two dead-letter records
// committed and before their OnDeadLettered calls ran; one record had no
// key. The partition's next owner runs both hooks once, from the owed rows,
// with the message, its origin and (for the key-less one) an empty key.
func TestCrossingOwedHookAcrossCrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	if err := schema.Migrate(testenv.Context(t), e.pool, nil, nil); err != nil {
		t.Fatal(err)
	}
	p := e.k.Producer(t)
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.StringEncoder("no key")}); err != nil {
		t.Fatal(err)
	}
	e.produce([]string{"bad"}, 1)
	child := e.startHelperProcess("TestOwedHookHelperProcess")
	if err := child.WaitWithin(t, 120*time.Second); !testenv.Killed(err) {
		t.Fatalf("helper ended with %v, want killed in its hook; its log:\n%s", err, child.Output())
	}
	if n := e.count(`SELECT count(*) FROM idem_txn_hooks`); n == 0 {
		t.Fatalf("no hook owed at the kill; the helper's log:\n%s", child.Output())
	}
	var mu sync.Mutex
	var got []consumer.DeadLettered
	cfg := txnConfig(e.config(), "owed-hook-member")
	cfg.OnDeadLettered = func(ctx context.Context, d consumer.DeadLettered) error {
		mu.Lock()
		got = append(got, d)
		mu.Unlock()
		return nil
	}
	r := start(t, cfg, handler.Func(func(context.Context, *handler.Message) error {
		return handler.Permanent(errors.New("poison"))
	}))
	e.waitCommitted(e.topic, 1, 90*time.Second)
	testenv.Eventually(t, 60*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(got) < 2 {
			return fmt.Errorf("%d hooks ran", len(got))
		}
		return nil
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM idem_txn_hooks`); n != 0 {
		t.Errorf("%d owed hooks left", n)
	}
	e.checkOnceInDLQ("bad")
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("%d hook calls, want 2", len(got))
	}
	for _, d := range got {
		o := d.Message.Origin()
		want := int64(0)
		if d.Message.IdempotencyKey == "bad" {
			want = 1
		} else if d.Message.IdempotencyKey != "" || d.Kind != handler.KindMissingKey {
			t.Errorf("hook for %q kind %s, want the key-less record with kind %s", d.Message.IdempotencyKey, d.Kind, handler.KindMissingKey)
		}
		if o.Topic != e.topic || o.Partition != 0 || o.Offset != want || o.Timestamp.IsZero() || d.Topic != e.dlq() {
			t.Errorf("hook for %q: origin %+v, DLQ %s; want %s/0/%d with its timestamp, DLQ %s", d.Message.IdempotencyKey, o, d.Topic, e.topic, want, e.dlq())
		}
	}
}

// A dropped parked message's owed OnExpired (found reading the round's
// diff): with Expiry{Drop, OnExpired}, H's drain drops P, whose deadline
// passed while it was parked behind H, and owes P's hook to the
// transaction carrying H's offset; the member is then stopped gracefully
// before that transaction commits (the drain reaches S). P's removal from
// the parked messages must not outlive that transaction: the next member
// drains P again, and P's hook runs exactly once.
func TestCrossingStopAfterDrainDropsExpired(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
		e.in(mode)
		cfg = mode.apply(cfg)
		if _, err := e.pool.Exec(testenv.Context(t), `CREATE TABLE expired_hook(key text)`); err != nil {
			t.Fatal(err)
		}
		cfg.Expiry = consumer.Expiry{Drop: true, OnExpired: func(ctx context.Context, x consumer.Expired) error {
			_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO expired_hook VALUES ($1)`, x.Message.IdempotencyKey)
			return err
		}}
		var deadline atomic.Int64 // P's, in Unix ms
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			if m.IdempotencyKey == "H" {
				if m.Topic == e.topic {
					return errors.New("H fails at its source")
				}
				select { // H's call in its tier outlasts P's deadline: P expires parked
				case <-time.After(time.Until(time.UnixMilli(deadline.Load())) + 300*time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return apply(ctx, m)
		})
		var ds drainStop // SIGTERM mid-drain at S, after P was dropped
		ds.run.set(startCtx(t, ds.ctx(t, "S"), cfg, h))
		// A first record, so that P is read (and parked) well before its
		// deadline however long the group takes to form.
		e.produceExpiry(expiryRec{ikey: "W", kafkaKey: "W"})
		e.waitSettled("W")
		deadline.Store(time.Now().Add(3 * time.Second).UnixMilli())
		e.produceExpiry(expiryRec{ikey: "H", kafkaKey: "K"},
			expiryRec{ikey: "P", kafkaKey: "K", deadline: strconv.FormatInt(deadline.Load(), 10)},
			expiryRec{ikey: "S", kafkaKey: "K"})
		ds.wait(t)
		cfg.Registerer = prometheus.NewRegistry()
		r := start(t, cfg, h)
		e.waitSettled("W,H,S")
		testenv.Eventually(t, 30*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM expired_hook WHERE key = 'P'`); n != 1 {
				return fmt.Errorf("P's OnExpired ran %d times, want once", n)
			}
			return nil
		})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		if n := e.count(`SELECT count(*) FROM expired_hook`); n != 1 {
			t.Errorf("%d OnExpired calls, want 1 (P's)", n)
		}
	})
}

// A member that lost its partition while it drained (a zombie: frozen past
// its session timeout, or replaced by a process with its InstanceID; found
// by the hour's swarm soak, seed 1796369855658974460, where a fenced twin
// took m1's InstanceID) must write no marked step after its successor's
// claim. Before the fence, the successor's next commit, past the zombie's
// mark, took the zombie's promotion for its own: the key stayed blocked
// behind a head whose forward had been aborted, with 21 records behind
// it. Here the successor's claim is recorded while the drain reaches D0:
// D0's step is refused, the member leaves the partition, and the next
// member drains once: D0 in the DLQ once, S applied, no row left.
func TestCrossingZombieDrainWritesNoMark(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
		e.in(mode)
		cfg = mode.apply(cfg)
		var c calls
		e.drainedKeys("D0", "S")
		var logs logBuffer
		zombie := cfg
		zombie.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		var claimed atomic.Bool
		store := keyorder.New(e.pool, cfg.Group)
		ctx := consumer.WithOrderHooks(testenv.Context(t), nil, func(_, hctx context.Context, rec keyorder.Record) {
			if rec.IdempotencyKey != "D0" || !claimed.CompareAndSwap(false, true) {
				return
			}
			for _, topic := range []string{e.topic, e.tier(1)} { // the successor's claims
				if err := store.Claim(hctx, topic, 0, "successor"); err != nil {
					t.Error(err)
				}
			}
		})
		a := startCtx(t, ctx, zombie, drainHandler(&c))
		testenv.Eventually(t, 60*time.Second, func() error {
			if !strings.Contains(logs.String(), "another claim of the partition came since this one's") {
				return errors.New("the drain's step after the successor's claim was not refused")
			}
			return nil
		})
		if err := a.stop(); err != nil {
			t.Fatal(err)
		}
		if n := e.count(`SELECT count(*) FROM idem_ordering_parked WHERE mark_topic IS NOT NULL`) +
			e.count(`SELECT count(*) FROM idem_ordering_heads WHERE mark_topic IS NOT NULL`); n != 0 {
			t.Errorf("%d ordering rows marked after the successor's claim", n)
		}
		cfg.Registerer = prometheus.NewRegistry()
		b := start(t, cfg, drainHandler(&c))
		e.waitSettled("H,S")
		if err := b.stop(); err != nil {
			t.Fatal(err)
		}
		e.checkOnceInDLQ("D0")
	})
}
