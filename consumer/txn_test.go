package consumer_test

// Transactional mode (Config.Transactions): forwards to retry tiers and the
// dead-letter topic commit with the source offsets in one Kafka transaction,
// so a read_committed reader sees each exactly once, whatever fails.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
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
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

const (
	txnPartitions = 3
	txnGood       = 240 // keys whose effect is in PostgreSQL
	txnPoison     = 30  // keys that always fail: source → tier 1 → DLQ
)

// txnConfig is e.config() in transactional mode with one short retry tier
// and no in-process retries.
func txnConfig(cfg consumer.Config, instance string) consumer.Config {
	cfg.Transactions.Enabled = true
	cfg.InstanceID = instance
	cfg.Retry.Attempts = 1
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{200 * time.Millisecond}}
	cfg.CommitInterval = 200 * time.Millisecond
	return cfg
}

// poisonHandler fails every "poison-" key (retriable) and writes the effect
// of the others.
func poisonHandler() handler.Func {
	eff := effectHandler()
	return func(ctx context.Context, m *handler.Message) error {
		if strings.HasPrefix(m.IdempotencyKey, "poison-") {
			return errors.New("poison")
		}
		return eff(ctx, m)
	}
}

// produceTxnKeys produces the good and the poison keys, interleaved.
func (e *env) produceTxnKeys() {
	e.t.Helper()
	var keys []string
	for i := range txnGood {
		keys = append(keys, fmt.Sprintf("good-%d", i))
		if i%(txnGood/txnPoison) == 0 {
			keys = append(keys, fmt.Sprintf("poison-%d", i/(txnGood/txnPoison)))
		}
	}
	e.produce(keys, txnPartitions)
}

func (e *env) tier1() string { return retrytopic.Policy{}.Tier(e.topic, e.group, 1) }
func (e *env) dlqTopic() string {
	return retrytopic.Policy{}.DLQ(e.topic, e.group)
}

// copies reads topic from the start at level and returns how many records
// each key has (see records).
func (e *env) copies(topic string, level sarama.IsolationLevel) map[string]int {
	e.t.Helper()
	out := map[string]int{}
	for _, m := range e.records(topic, level) {
		out[string(m.Key)]++
	}
	return out
}

// records reads topic from the start at level and returns its records. It
// appends a sentinel to every partition (outside any transaction) and reads
// up to it, which a read_committed reader gets past only once every earlier
// transaction has ended; sentinels of earlier calls are skipped. Call it
// when no member consumes topic any more.
func (e *env) records(topic string, level sarama.IsolationLevel) []*sarama.ConsumerMessage {
	e.t.Helper()
	const sentinel = "idem-test-sentinel"
	cfg := e.k.SaramaConfig()
	cfg.Consumer.IsolationLevel = level
	c, err := sarama.NewConsumer(e.k.Brokers, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	parts, err := c.Partitions(topic)
	if err != nil {
		e.t.Fatal(err)
	}
	p := e.k.Producer(e.t)
	ends := map[int32]int64{} // the offset of this call's sentinel (an earlier call's are skipped)
	for _, part := range parts {
		_, off, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: part, Key: sarama.StringEncoder(sentinel)})
		if err != nil {
			e.t.Fatal(err)
		}
		ends[part] = off
	}
	var out []*sarama.ConsumerMessage
	for _, part := range parts {
		pc, err := c.ConsumePartition(topic, part, sarama.OffsetOldest)
		if err != nil {
			e.t.Fatal(err)
		}
		deadline := time.NewTimer(60 * time.Second)
	read:
		for {
			select {
			case m := <-pc.Messages():
				if string(m.Key) == sentinel {
					if m.Offset >= ends[part] {
						break read
					}
					continue
				}
				out = append(out, m)
			case <-deadline.C:
				e.t.Fatalf("%s/%d: the sentinel was not read within 60 s (a transaction left open?)", topic, part)
			}
		}
		deadline.Stop()
		pc.AsyncClose()
	}
	return out
}

// assertExactlyOnceForwards checks that a read_committed reader sees every
// poison key exactly once in tier 1 and once in the DLQ, and nothing else;
// and that the effects are one per good key. It returns the records a
// read_uncommitted reader sees in both topics (aborted copies included).
func (e *env) assertExactlyOnceForwards() (uncommitted int) {
	e.t.Helper()
	for _, topic := range []string{e.tier1(), e.dlqTopic()} {
		got := e.copies(topic, sarama.ReadCommitted)
		for i := range txnPoison {
			if n := got[fmt.Sprintf("poison-%d", i)]; n != 1 {
				e.t.Errorf("%s: poison-%d has %d copies for a read_committed reader, want 1", topic, i, n)
			}
		}
		if len(got) != txnPoison {
			e.t.Errorf("%s: %d keys for a read_committed reader, want the %d poison keys", topic, len(got), txnPoison)
		}
		for _, n := range e.copies(topic, sarama.ReadUncommitted) {
			uncommitted += n
		}
	}
	if got := e.count(`SELECT count(*) FROM effects`); got != txnGood {
		e.t.Errorf("effects = %d, want %d", got, txnGood)
	}
	if got := e.count(`SELECT count(DISTINCT key) FROM effects`); got != txnGood {
		e.t.Errorf("distinct effect keys = %d, want %d", got, txnGood)
	}
	return uncommitted
}

// waitTxnSettled waits until reg's member has dead-lettered every poison key
// and written every effect.
func (e *env) waitTxnSettled(reg prometheus.Gatherer) {
	e.t.Helper()
	testenv.Eventually(e.t, 120*time.Second, func() error {
		dl := coreOutcome(e.t, reg, coremetrics.OutcomeDeadLettered)
		eff := e.count(`SELECT count(*) FROM effects`)
		if dl < txnPoison || eff < txnGood {
			return fmt.Errorf("dead-lettered %d of %d, effects %d of %d", dl, txnPoison, eff, txnGood)
		}
		return nil
	})
}

// Environment of the transactional member helper process.
const (
	txnEnvPoint = "IDEM_TXN_POINT" // see TestTxnMemberHelperProcess
	txnEnvLanes = "IDEM_TXN_LANES" // Config.Concurrency, when set; "adaptive": Config.Limits.Adaptive up to 8 lanes
)

// TestTxnMemberHelperProcess is not a test: the transactional tests run the
// test binary again with only this function (startTxnChild). It runs a
// transactional member (the member helper's environment, see
// TestMemberHelperProcess; IDEM_TXN_LANES lanes)
// whose first commit of a transaction holding records, after its offsets
// were added, either SIGKILLs the process (IDEM_TXN_POINT=kill) or prints
// "pending" and waits for a line on stdin (stall), then goes on. With
// "kill-next" that transaction commits and the process SIGKILLs itself at
// the next commit: what the first one committed must cover its forwards.
// With "kill-drain" it SIGKILLs itself at the first commit of a transaction
// holding a drain's forwards (IDEM_TXN_ORDERING: Ordering ByKey).
// Outside that child it returns at once.
func TestTxnMemberHelperProcess(t *testing.T) {
	if !testenv.InChild("TestTxnMemberHelperProcess") {
		return
	}
	ctx, pool, session := memberHelperEnv(t)
	var once sync.Once
	var committed atomic.Bool // kill-next: a transaction with records committed
	point := os.Getenv(txnEnvPoint)
	kill := func() {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	ctx = consumer.WithBeforeCommitHook(ctx, func(records int) error {
		if committed.Load() {
			kill()
		}
		if records == 0 {
			return nil
		}
		if point == "kill-drain" { // a drain's steps are marked: this transaction holds its forwards
			var marked int
			if err := pool.QueryRow(ctx, markedRowsQuery()).Scan(&marked); err == nil && marked > 0 {
				kill()
			}
			return nil
		}
		once.Do(func() {
			switch point {
			case "kill":
				kill()
			case "kill-next":
				committed.Store(true)
			case "stall":
				fmt.Println("pending")
				_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
			}
		})
		return nil
	})
	scfg := staticSarama(session)
	scfg.Consumer.Group.Rebalance.Timeout = 2 * session
	cfg := txnConfig(consumer.Config{
		Brokers:        strings.Split(os.Getenv(memberEnvBrokers), ","),
		Group:          os.Getenv(memberEnvGroup),
		Topics:         []string{os.Getenv(memberEnvTopic)},
		Dedupe:         dedupe.NewPostgres(pool),
		Sarama:         scfg,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		ShutdownGrace:  5 * time.Second,
		Retry:          consumer.RetryConfig{Backoff: recovery.Backoff{Base: 5 * time.Millisecond, Max: 20 * time.Millisecond}},
		CommitInterval: 200 * time.Millisecond,
	}, os.Getenv(memberEnvInstance))
	cfg = txnLanes(cfg, os.Getenv(txnEnvLanes))
	cfg.Transactions.Timeout = time.Minute // a stalled member's transaction must outlive its membership
	h := poisonHandler()
	if os.Getenv(txnEnvOrdering) != "" {
		cfg.Ordering, h = consumer.ByKey(pool), orderedTxnHandler()
	}
	err := consumer.Run(ctx, cfg, h)
	t.Fatalf("txn member helper: Run returned %v before it was killed", err)
}

// txnLanes returns cfg with lanes: "" keeps cfg's, "adaptive" is
// Config.Limits.Adaptive up to 8 lanes, a number is Config.Concurrency.
func txnLanes(cfg consumer.Config, lanes string) consumer.Config {
	if lanes == "adaptive" {
		cfg.Limits.Adaptive = &consumer.Adaptive{Max: 8}
	} else if n, err := strconv.Atoi(lanes); err == nil {
		cfg.Concurrency = n
	}
	return cfg
}

// startTxnChild starts the transactional member helper with its point, its
// InstanceID and its session timeout; env adds variables (txnEnvLanes).
func (e *env) startTxnChild(point, instance string, session time.Duration, env ...string) *testenv.Child {
	e.t.Helper()
	env = append(append([]string{txnEnvPoint + "=" + point}, env...), e.memberEnv(instance, session)...)
	return testenv.StartChild(e.t, "TestTxnMemberHelperProcess", env...)
}

// (a) A member dies (SIGKILL) after its forwards and offsets are in the
// transaction, before the commit. Its successor (same InstanceID, so the
// same transactional.id: it fences the dead producer and aborts its
// transaction) handles those records again: a read_committed reader sees
// every poison key once in the tier and once in the DLQ, and every effect
// is applied once. With lanes (issue 20) too, and killed at the commit
// after one that committed forwards: lanes finish messages out of order, so
// a forward must commit with an offset that covers it, or the successor
// forwards it again.
func TestTxnKillBetweenForwardAndCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, point string
		lanes       string // txnLanes; "": one lane
	}{
		{"one lane", "kill", ""},
		{"one lane, after a commit", "kill-next", ""},
		{"lanes", "kill", "8"},
		{"lanes, after a commit", "kill-next", "8"},
		{"adaptive, after a commit", "kill-next", "adaptive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, txnPartitions)
			e.produceTxnKeys()
			child := e.startTxnChild(tc.point, "txn-member", 10*time.Second, txnEnvLanes+"="+tc.lanes)
			if err := child.WaitWithin(t, 120*time.Second); !testenv.Killed(err) {
				t.Fatalf("txn member helper ended with %v, want killed at a commit; its log:\n%s", err, child.Output())
			}
			reg := prometheus.NewRegistry()
			cfg := txnLanes(txnConfig(e.config(), "txn-member"), tc.lanes)
			cfg.Registerer = reg
			r := start(t, cfg, poisonHandler())
			e.waitTxnSettled(reg)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			uncommitted := e.assertExactlyOnceForwards()
			// The killed transaction's records are in the log, aborted: the
			// crash window was exercised. (kill-next's killed transaction
			// may hold offsets only.)
			if tc.point == "kill" && uncommitted <= 2*txnPoison {
				t.Errorf("read_uncommitted readers see %d records in the tier and the DLQ, want more than %d (the killed member's aborted forwards)", uncommitted, 2*txnPoison)
			}
		})
	}
}

// (b) A zombie: a member is frozen (SIGSTOP) in the middle of a commit, after
// its offsets were added, past its session timeout; the group moves on
// without it and a new member handles its partitions. Thawed, the zombie's
// commit carries its stale generation: the broker refuses it, the
// transaction is aborted and nothing it forwarded becomes visible.
func TestTxnZombieCannotCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, txnPartitions)
	e.produceTxnKeys()
	const session = 6 * time.Second // the broker's minimum
	zombie := e.startTxnChild("stall", "", session)
	if _, err := zombie.WaitForWithin(120*time.Second, func(l string) bool { return l == "pending" }); err != nil {
		t.Fatalf("zombie never reached a commit with records: %v; its log:\n%s", err, zombie.Output())
	}
	if err := zombie.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The successor takes every partition (source and tier) once the
	// zombie's session expired. (It cannot get far before the zombie thaws:
	// the zombie was frozen inside a PostgreSQL transaction too, whose
	// inbox row locks hold the successor's message of that key.)
	reg := prometheus.NewRegistry()
	cfg := txnConfig(e.config(), "")
	cfg.Registerer = reg
	r := start(t, cfg, poisonHandler())
	testenv.Eventually(t, 120*time.Second, func() error {
		if n := coreClaimed(t, reg); n < 2*txnPartitions {
			return fmt.Errorf("the successor claims %d of %d partitions", n, 2*txnPartitions)
		}
		return nil
	})
	if err := zombie.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(zombie.Stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		if !strings.Contains(zombie.Stderr(), "Kafka transaction failed and aborted") {
			return fmt.Errorf("the zombie has not failed its commit yet")
		}
		return nil
	})
	t.Logf("zombie's log:\n%s", zombie.Output())
	_ = zombie.Stop()
	e.waitTxnSettled(reg)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if uncommitted := e.assertExactlyOnceForwards(); uncommitted <= 2*txnPoison {
		t.Errorf("read_uncommitted readers see %d records in the tier and the DLQ, want more than %d (the zombie's aborted forwards)", uncommitted, 2*txnPoison)
	}
}

// (c) A transaction that fails (forced, as an abortable error at the commit
// would) is aborted; the member ends its session and handles the records
// again from the committed offsets: nothing lost, nothing doubled for a
// read_committed reader.
func TestTxnAbortReprocesses(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{0, 50} {
		t.Run(fmt.Sprintf("batch %d", batch), func(t *testing.T) {
			t.Parallel()
			txnAbortReprocesses(t, batch)
		})
	}
}

func txnAbortReprocesses(t *testing.T, batch int) {
	e := newEnv(t, txnPartitions)
	e.produceTxnKeys()
	var aborts sync.Map
	ctx := consumer.WithBeforeCommitHook(testenv.Context(t), func(records int) error {
		if records == 0 {
			return nil
		}
		// Abort the first three transactions that hold records.
		for i := range 3 {
			if _, loaded := aborts.LoadOrStore(i, records); !loaded {
				return fmt.Errorf("forced abort %d (%d records)", i+1, records)
			}
		}
		return nil
	})
	reg := prometheus.NewRegistry()
	cfg := txnConfig(e.config(), "")
	cfg.Batch = consumer.BatchConfig{MaxMessages: batch}
	cfg.Registerer = reg
	r := startCtx(t, ctx, cfg, poisonHandler())
	e.waitTxnSettled(reg)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if uncommitted := e.assertExactlyOnceForwards(); uncommitted <= 2*txnPoison {
		t.Errorf("read_uncommitted readers see %d records in the tier and the DLQ, want more than %d (the aborted forwards)", uncommitted, 2*txnPoison)
	}
	if n := coreOutcome(t, reg, coremetrics.OutcomeDeadLettered); n < txnPoison {
		t.Errorf("dead-lettered %d, want >= %d", n, txnPoison)
	}
}

// A producer fenced by another with the same transactional.id (a member
// started twice, an operator's tool): the member's commit fails for good,
// the producer is closed and made anew (fencing the other in turn), and
// the records of the failed transaction are handled again: nothing lost,
// nothing doubled for a read_committed reader.
func TestTxnFencedProducerIsRecreated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, txnPartitions)
	e.produceTxnKeys()
	const instance = "fenced-member"
	id := consumer.TransactionalIDOf(txnConfig(e.config(), instance))
	var fenced sync.Once
	var fenceErr error
	ctx := consumer.WithBeforeCommitHook(testenv.Context(t), func(records int) error {
		if records == 0 {
			return nil
		}
		fenced.Do(func() {
			// InitProducerId with the member's transactional.id bumps the
			// epoch: the member's producer is fenced from here on.
			c := e.k.SaramaConfig()
			c.Version = sarama.V4_1_0_0
			retrytopic.ConfigureProducer(c)
			c.Producer.Transaction.ID = id
			p, err := sarama.NewSyncProducer(e.k.Brokers, c)
			if err != nil {
				fenceErr = err
				return
			}
			fenceErr = p.Close()
		})
		return nil
	})
	reg := prometheus.NewRegistry()
	cfg := txnConfig(e.config(), instance)
	cfg.Registerer = reg
	var logs logBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r := startCtx(t, ctx, cfg, poisonHandler())
	e.waitTxnSettled(reg)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if fenceErr != nil {
		t.Fatalf("the fencing producer: %v", fenceErr)
	}
	if !strings.Contains(logs.String(), "Kafka transaction failed and aborted") {
		t.Fatalf("the member's commit did not fail after its producer was fenced; its log:\n%s", logs.String())
	}
	t.Logf("the member's failure: %s", firstLine(logs.String(), "Kafka transaction failed"))
	if uncommitted := e.assertExactlyOnceForwards(); uncommitted <= 2*txnPoison {
		t.Errorf("read_uncommitted readers see %d records in the tier and the DLQ, want more than %d (the fenced transaction's forwards)", uncommitted, 2*txnPoison)
	}
}

// firstLine returns the first line of s containing sub.
func firstLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// With lanes and Transactions a forward waits, holding nothing, until every
// earlier message of its partition is final, so its offset commits in its
// transaction (issue 20): a poison message behind a slow one in another lane
// is not forwarded while the slow one runs, nor is anything committed past
// the slow one; once it finishes, the poison message goes to the tier and
// on to the DLQ, once each for a read_committed reader.
func TestTxnForwardWaitsForEarlierMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const lanes = 4
	laneOf := func(k string) uint32 {
		h := fnv.New32a()
		h.Write([]byte(k))
		return h.Sum32() % lanes
	}
	poison := "poison-0"
	for i := 1; laneOf(poison) == laneOf("slow"); i++ {
		poison = fmt.Sprintf("poison-%d", i)
	}
	e.produce([]string{"slow", poison, "after"}, 1)
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	inner := poisonHandler()
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.IdempotencyKey == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return inner(ctx, m)
	})
	cfg := txnConfig(e.config(), "")
	cfg.Concurrency, cfg.Limits.Adaptive, cfg.Batch = lanes, nil, consumer.BatchConfig{}
	var logs logBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	r := start(t, cfg, h)
	testenv.Eventually(t, 60*time.Second, func() error {
		if !strings.Contains(logs.String(), "forward waits for the earlier messages of its partition") {
			return errors.New("the poison message's forward is not waiting")
		}
		return nil
	})
	if n := e.total(e.tier1(), 1); n != 0 {
		t.Fatalf("tier 1 holds %d records while the slow message runs, want 0 (the forward waits)", n)
	}
	if got := e.committed(e.topic, 1)[0]; got > 0 {
		t.Fatalf("committed offset %d while the message at offset 0 runs, want none", got)
	}
	releaseOnce.Do(func() { close(release) })
	testenv.Eventually(t, 60*time.Second, func() error {
		if dl, eff := coreOutcome(t, reg, coremetrics.OutcomeDeadLettered), e.count(`SELECT count(*) FROM effects`); dl < 1 || eff < 2 {
			return fmt.Errorf("dead-lettered %d of 1, effects %d of 2", dl, eff)
		}
		return nil
	})
	e.waitCommitted(e.topic, 1, 30*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{e.tier1(), e.dlqTopic()} {
		if got := e.copies(topic, sarama.ReadCommitted); len(got) != 1 || got[poison] != 1 {
			t.Errorf("%s holds %v for a read_committed reader, want one %s", topic, got, poison)
		}
	}
}
