package consumer_test

// Core integration tests of consumer.Run against a real broker and a real
// PostgreSQL: crash recovery, retry-then-success, group membership changes,
// graceful shutdown, configuration errors and poison messages.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/metrics"
	"github.com/idemhq/idem/retrytopic"
)

// ---------------------------------------------------------------------------
// helpers of this file

// messagesOutcome is idem_messages_total{outcome} summed over topics.
func coreOutcome(t *testing.T, g prometheus.Gatherer, outcome string) int {
	t.Helper()
	return int(gatherSum(t, g, "idem_messages_total", map[string]string{"outcome": outcome}))
}

// claimed is idem_partitions_assigned of one member (its own registry).
func coreClaimed(t *testing.T, g prometheus.Gatherer) int {
	t.Helper()
	return int(gatherSum(t, g, "idem_partitions_assigned", nil))
}

// coreTokens gates a handler: each call takes one token before it writes its
// effect, so the test decides how far the stream may go. open lets every
// later call through.
type coreTokens struct {
	ch    chan struct{}
	once  sync.Once
	taken atomic.Int64
}

func coreNewTokens() *coreTokens { return &coreTokens{ch: make(chan struct{}, 100000)} }

func (g *coreTokens) release(n int) {
	for range n {
		g.ch <- struct{}{}
	}
}

func (g *coreTokens) open() { g.once.Do(func() { close(g.ch) }) }

func (g *coreTokens) take(ctx context.Context) error {
	select {
	case <-g.ch:
		g.taken.Add(1)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// coreWaitProgress waits until the stream has moved n messages on: n
// committed effects, or, when messages commit in batches (IDEM_TEST_MODE
// batch modes, where a batch waiting for a token holds back the effects of
// its members), n tokens taken.
func (e *env) coreWaitProgress(g *coreTokens, n int, timeout time.Duration) {
	e.t.Helper()
	if !strings.Contains(os.Getenv("IDEM_TEST_MODE"), "batch") {
		e.coreWaitEffects(n, timeout)
		return
	}
	testenv.Eventually(e.t, timeout, func() error {
		if got := g.taken.Load(); got < int64(n) {
			return fmt.Errorf("tokens taken = %d, waiting for %d", got, n)
		}
		return nil
	})
}

// gatedEffectHandler is effectHandler behind a token gate.
func coreGatedHandler(g *coreTokens) handler.Func {
	eff := effectHandler()
	return func(ctx context.Context, m *handler.Message) error {
		if err := g.take(ctx); err != nil {
			return err
		}
		return eff(ctx, m)
	}
}

// uniqueKeys returns n distinct keys.
func coreKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return keys
}

// waitEffects polls until the effects table holds at least n rows.
func (e *env) coreWaitEffects(n int, timeout time.Duration) {
	e.t.Helper()
	testenv.Eventually(e.t, timeout, func() error {
		if got := e.count(`SELECT count(*) FROM effects`); got < n {
			return fmt.Errorf("effects = %d, waiting for %d", got, n)
		}
		return nil
	})
}

// assertOneEffectPerKey checks that exactly uniq distinct keys have effects,
// each exactly once.
func (e *env) coreAssertOnePerKey(uniq int) {
	e.t.Helper()
	if got := e.count(`SELECT count(*) FROM effects`); got != uniq {
		doubles := e.count(`SELECT count(*) FROM (SELECT key FROM effects GROUP BY key HAVING count(*) > 1) d`)
		e.t.Errorf("effects = %d, want %d (one per unique key); keys with more than one effect: %d", got, uniq, doubles)
	}
	if got := e.count(`SELECT count(DISTINCT key) FROM effects`); got != uniq {
		e.t.Errorf("distinct effect keys = %d, want %d (keys without an effect: %d)", got, uniq, uniq-got)
	}
	if got := e.count(`SELECT count(*) FROM idem_processed WHERE consumer_group = $1`, e.group); got != uniq {
		e.t.Errorf("inbox rows = %d, want %d", got, uniq)
	}
}

// readRecords reads n records of topic/partition from the oldest offset.
func (e *env) coreReadRecords(topic string, partition int32, n int, timeout time.Duration) []*sarama.ConsumerMessage {
	e.t.Helper()
	c, err := sarama.NewConsumer(e.k.Brokers, e.k.Config())
	if err != nil {
		e.t.Fatalf("consumer: %v", err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, partition, sarama.OffsetOldest)
	if err != nil {
		e.t.Fatalf("consume %s/%d: %v", topic, partition, err)
	}
	defer pc.Close()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var out []*sarama.ConsumerMessage
	for len(out) < n {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
		case err := <-pc.Errors():
			e.t.Fatalf("consume %s/%d: %v", topic, partition, err)
		case <-deadline.C:
			e.t.Fatalf("read %d of %d records of %s/%d within %s", len(out), n, topic, partition, timeout)
		}
	}
	return out
}

func coreHeader(m *sarama.ConsumerMessage, key string) (string, bool) {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if h := m.Headers[i]; h != nil && string(h.Key) == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// schema returns the PostgreSQL schema the test's pool uses.
func (e *env) coreSchema() string {
	e.t.Helper()
	var s string
	if err := e.pool.QueryRow(context.Background(), `SELECT current_schema()`).Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	return s
}

// ---------------------------------------------------------------------------
// 2. A crash after the database COMMIT, before the offset commit.

// Environment of the crash helper process.
const (
	crashEnvFlag    = "IDEM_CRASH_HELPER"
	crashEnvTopic   = "IDEM_CRASH_TOPIC"
	crashEnvGroup   = "IDEM_CRASH_GROUP"
	crashEnvSchema  = "IDEM_CRASH_SCHEMA"
	crashEnvLimit   = "IDEM_CRASH_LIMIT"
	crashEnvBrokers = "IDEM_CRASH_BROKERS"
	crashEnvDB      = "IDEM_CRASH_DATABASE_URL"
)

// TestCrashHelperProcess is not a test: TestCrashAfterCommitBeforeOffsetCommit
// runs the test binary again with only this function and IDEM_CRASH_HELPER=1,
// and SIGKILLs it. It runs consumer.Run with a one-hour CommitInterval, so no
// offset is committed before the kill; its handler writes the effects of the
// first IDEM_CRASH_LIMIT messages and then blocks (holding its transaction
// open) until the process dies. Without the variable it returns at once.
func TestCrashHelperProcess(t *testing.T) {
	if os.Getenv(crashEnvFlag) != "1" {
		return
	}
	limit, err := strconv.Atoi(os.Getenv(crashEnvLimit))
	if err != nil {
		t.Fatal(err)
	}
	// A safety net: the parent kills us long before this.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pcfg, err := pgxpool.ParseConfig(os.Getenv(crashEnvDB))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(crashEnvSchema)
	// Named, so that the parent can wait for its sessions to end.
	pcfg.ConnConfig.RuntimeParams["application_name"] = crashAppName(os.Getenv(crashEnvSchema))
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	scfg := sarama.NewConfig()
	scfg.Version = testenv.KafkaVersion
	// The broker's minimum, so that the restarted consumer's join does not
	// wait long for this dead member to be evicted.
	scfg.Consumer.Group.Session.Timeout = 6 * time.Second
	scfg.Consumer.Group.Heartbeat.Interval = time.Second

	var calls atomic.Int64
	eff := effectHandler()
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if calls.Add(1) > int64(limit) {
			<-ctx.Done() // hold the transaction open until we are killed
			return ctx.Err()
		}
		return eff(ctx, m)
	})
	err = consumer.Run(ctx, modeConfig(consumer.Config{
		Brokers:        strings.Split(os.Getenv(crashEnvBrokers), ","),
		Group:          os.Getenv(crashEnvGroup),
		Topics:         []string{os.Getenv(crashEnvTopic)},
		Dedupe:         dedupe.NewPostgres(pool),
		Sarama:         scfg,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
		CommitInterval: time.Hour, // never by the ticker: the kill comes first
	}, os.Getenv("IDEM_TEST_MODE")), h)
	t.Fatalf("crash helper: Run returned %v before it was killed", err)
}

// crashAppName is the application_name of the crash helper's sessions.
func crashAppName(schema string) string { return "idem-crash-helper-" + schema }

// Test 2: the consumer process dies (SIGKILL) after effects were committed in
// PostgreSQL but before their offsets were committed to Kafka. The restarted
// consumer gets those messages again; the inbox turns each into a duplicate, so
// every key ends with exactly one effect.
func TestCrashAfterCommitBeforeOffsetCommit(t *testing.T) {
	t.Parallel()
	const partitions, total, limit = 3, 600, 240
	e := newEnv(t, partitions)
	e.produce(coreKeys("crash", total), partitions)

	var out bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		crashEnvFlag+"=1", crashEnvTopic+"="+e.topic, crashEnvGroup+"="+e.group,
		crashEnvSchema+"="+e.coreSchema(), crashEnvLimit+"="+strconv.Itoa(limit),
		crashEnvBrokers+"="+strings.Join(e.k.Brokers, ","), crashEnvDB+"="+testenv.DatabaseURL(t))
	cmd.Stdout, cmd.Stderr = &out, &out // read only after Wait
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var killOnce sync.Once
	kill := func() error {
		var err error
		killOnce.Do(func() {
			_ = cmd.Process.Kill() // SIGKILL: no deferred code, no revoke, no offset commit
			err = <-waited
			if out.Len() > 0 {
				t.Logf("crash helper output:\n%s", out.String())
			}
		})
		return err
	}
	t.Cleanup(func() { _ = kill() })

	// The helper commits exactly `limit` effects, then blocks. In batch and
	// lane modes a blocked message also holds back the uncommitted rest of
	// its batch, so fewer are committed: wait for some.
	want := limit
	if os.Getenv("IDEM_TEST_MODE") != "" {
		want = 1
	}
	testenv.Eventually(t, 90*time.Second, func() error {
		select {
		case err := <-waited:
			waited <- err
			return nil // reported below
		default:
		}
		if got := e.count(`SELECT count(*) FROM effects`); got < want {
			return fmt.Errorf("effects = %d, waiting for %d", got, want)
		}
		return nil
	})
	err := kill()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != -1 {
		t.Fatalf("crash helper ended with %v before it was killed", err)
	}

	// A COMMIT the helper sent just before the kill may still complete on the
	// server: count the effects only once its sessions have ended.
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = left($1, 63)`, crashAppName(e.coreSchema())); n > 0 {
			return fmt.Errorf("%d sessions of the killed helper still open", n)
		}
		return nil
	})
	atKill := e.count(`SELECT count(*) FROM effects`)
	if atKill > limit || (want == limit && atKill != limit) {
		t.Fatalf("after the kill, effects = %d, want %d (blocked transactions must roll back)", atKill, limit)
	}
	// The crash left effects whose offsets were never committed.
	committed := e.committed(e.topic, partitions)
	redelivered := 0
	for p := range int32(partitions) {
		c := max(committed[p], 0) // -1: nothing committed
		redelivered += e.count(`SELECT count(*) FROM effects WHERE part = $1 AND off >= $2`, p, c)
	}
	t.Logf("committed at the crash: %v; effects beyond the committed offsets: %d", committed, redelivered)
	if redelivered == 0 {
		t.Fatalf("every effect's offset was committed before the kill (committed %v): the crash window was not exercised", committed)
	}

	// Restart with an ordinary consumer.
	reg := prometheus.NewRegistry()
	cfg := e.config()
	cfg.Registerer = reg
	start(t, cfg, effectHandler())
	e.waitCommitted(e.topic, partitions, 120*time.Second)
	e.coreAssertOnePerKey(total)
	if dup := coreOutcome(t, reg, metrics.OutcomeDuplicate); dup < redelivered {
		t.Errorf("idem_messages_total{outcome=duplicate} = %d after the restart, want >= %d (redelivered messages whose effects were committed)", dup, redelivered)
	}
	if got := coreOutcome(t, reg, metrics.OutcomeProcessed); got != total-atKill {
		t.Errorf("idem_messages_total{outcome=processed} = %d after the restart, want %d", got, total-atKill)
	}
}

// ---------------------------------------------------------------------------
// 3. Fail, then succeed.

// Test 3: a handler fails once and then succeeds. After the failure the inbox
// holds no row for the key (the failed attempt's transaction rolled back, so a
// retry is not mistaken for a duplicate); the row appears only with the
// successful attempt, and there is exactly one effect.
func TestFailThenSucceedRecordsKeyOnlyOnSuccess(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const key = "flaky-1"
	e.produce([]string{key}, 1)

	entered := make(chan struct{})
	release := make(chan struct{})
	var (
		mu       sync.Mutex
		attempts []int
		inTx     = -1
	)
	eff := effectHandler()
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		mu.Lock()
		attempts = append(attempts, m.Attempt)
		n := len(attempts)
		mu.Unlock()
		if n == 1 {
			return errors.New("transient failure")
		}
		if n == 2 {
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		// Inside the transaction the attempt's own inbox row is visible.
		var c int
		if err := dedupe.Tx(ctx).QueryRow(ctx, `SELECT count(*) FROM idem_processed WHERE idempotency_key = $1`, key).Scan(&c); err != nil {
			return err
		}
		mu.Lock()
		inTx = c
		mu.Unlock()
		return eff(ctx, m)
	})
	start(t, e.config(), h)

	select {
	case <-entered:
	case <-time.After(60 * time.Second):
		t.Fatal("the handler was not called a second time")
	}
	// The second attempt is blocked: the first one failed and rolled back.
	if got := e.count(`SELECT count(*) FROM idem_processed WHERE consumer_group = $1 AND idempotency_key = $2`, e.group, key); got != 0 {
		t.Errorf("after the failed attempt the inbox has %d rows for the key, want 0", got)
	}
	if got := e.count(`SELECT count(*) FROM effects`); got != 0 {
		t.Errorf("after the failed attempt effects = %d, want 0", got)
	}
	close(release)

	e.waitCommitted(e.topic, 1, 60*time.Second)
	if got := e.count(`SELECT count(*) FROM idem_processed WHERE consumer_group = $1 AND idempotency_key = $2`, e.group, key); got != 1 {
		t.Errorf("after success the inbox has %d rows for the key, want 1", got)
	}
	if got := e.count(`SELECT count(*) FROM effects WHERE key = $1`, key); got != 1 {
		t.Errorf("effects = %d, want 1", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(attempts) != "[1 2]" {
		t.Errorf("handler saw Attempt %v, want [1 2]", attempts)
	}
	if inTx != 1 {
		t.Errorf("inside the successful attempt's transaction the inbox row count was %d, want 1", inTx)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"idem_handler_attempts_total", map[string]string{"result": metrics.ResultError}, 1},
		{"idem_handler_attempts_total", map[string]string{"result": metrics.ResultOK}, 1},
		{"idem_retries_total", nil, 1},
		{"idem_messages_total", map[string]string{"outcome": metrics.OutcomeProcessed}, 1},
		{"idem_messages_total", map[string]string{"outcome": metrics.OutcomeDeadLettered}, 0},
	} {
		if got := gatherSum(t, e.reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// ---------------------------------------------------------------------------
// 4. Membership changes mid-stream.

// Test 4: three members of one group consume a stream; one leaves and another
// joins while messages are in flight. Every unique key ends with exactly one
// effect and every offset is committed. Progress is gated by tokens, so the
// membership changes happen at known points of the stream, not by timing.
func TestMembersLeaveAndJoinMidStream(t *testing.T) {
	t.Parallel()
	const partitions, total = 6, 3000
	e := newEnv(t, partitions)
	keys, uniq := keysWithDuplicates(total, 0.1, 4)
	// The last third is produced only once d has joined, so every partition
	// d claims still has new keys for it, whichever partitions the assignor
	// moves (ones a and c already finished would leave d nothing to do).
	const late = total / 3
	e.produce(keys[:total-late], partitions)

	gate := coreNewTokens()
	t.Cleanup(gate.open) // let blocked handlers go when the test fails early
	h := coreGatedHandler(gate)
	type member struct {
		name string
		reg  *prometheus.Registry
		run  *running
	}
	join := func(name string) *member {
		m := &member{name: name, reg: prometheus.NewRegistry()}
		cfg := e.config()
		cfg.Registerer = m.reg
		cfg.ShutdownGrace = time.Second // in-flight handlers waiting for tokens are cancelled at revoke
		m.run = start(t, cfg, h)
		return m
	}
	waitClaims := func(want map[*member]int) {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, func() error {
			for m, n := range want {
				if got := coreClaimed(t, m.reg); got != n {
					return fmt.Errorf("member %s claims %d partitions, want %d", m.name, got, n)
				}
			}
			return nil
		})
	}

	a, b, c := join("a"), join("b"), join("c")
	waitClaims(map[*member]int{a: 2, b: 2, c: 2})

	gate.release(600)
	e.coreWaitProgress(gate, 590, 60*time.Second)

	// b leaves while the stream moves on.
	gate.release(600)
	if err := b.run.stop(); err != nil {
		t.Fatalf("member b: Run = %v", err)
	}
	waitClaims(map[*member]int{a: 3, c: 3})

	// d joins while the stream moves on.
	gate.release(600)
	d := join("d")
	waitClaims(map[*member]int{a: 2, c: 2, d: 2})
	e.produce(keys[total-late:], partitions)
	e.coreWaitProgress(gate, 1750, 60*time.Second)

	gate.open()
	e.waitCommitted(e.topic, partitions, 120*time.Second)
	e.coreAssertOnePerKey(uniq)

	processed := 0
	for _, m := range []*member{a, b, c, d} {
		n := coreOutcome(t, m.reg, metrics.OutcomeProcessed)
		t.Logf("member %s processed %d, duplicates %d", m.name, n, coreOutcome(t, m.reg, metrics.OutcomeDuplicate))
		if n == 0 {
			t.Errorf("member %s processed nothing: it took no part in the stream", m.name)
		}
		processed += n
	}
	if processed != uniq {
		t.Errorf("processed over all members = %d, want %d", processed, uniq)
	}
}

// ---------------------------------------------------------------------------
// 5. Graceful shutdown mid-stream, then restart.

// Test 5: Run is cancelled when about half the stream has effects. The offsets
// committed at shutdown are exactly those of the finished messages (each
// partition's effects are offsets [0, committed)); the restarted consumer
// completes the stream without a gap and without a double effect.
func TestGracefulShutdownMidStreamThenRestart(t *testing.T) {
	t.Parallel()
	const partitions, total = 4, 1200
	e := newEnv(t, partitions)
	e.produce(coreKeys("graceful", total), partitions)

	gate := coreNewTokens()
	t.Cleanup(gate.open)
	reg1 := prometheus.NewRegistry()
	cfg := e.config()
	cfg.Registerer = reg1
	cfg.CommitInterval = time.Hour // only the shutdown commits
	r1 := start(t, cfg, coreGatedHandler(gate))

	gate.release(total / 2)
	e.coreWaitProgress(gate, total/2, 60*time.Second)
	// Every partition now has a handler waiting for a token. Cancel, then let
	// the in-flight ones finish within the grace period.
	r1.cancel()
	gate.release(partitions)
	if err := r1.stop(); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}

	done := e.count(`SELECT count(*) FROM effects`)
	committed := e.committed(e.topic, partitions)
	t.Logf("at shutdown: effects %d, committed %v", done, committed)
	if done >= total {
		t.Fatalf("the stream completed before the shutdown (effects %d): not mid-stream", done)
	}
	// With lanes, messages above the lowest unfinished one may have finished
	// too: their offsets are not committed (the restart sees them again as
	// duplicates), but below the committed offset there is never a gap.
	lanes := strings.Contains(os.Getenv("IDEM_TEST_MODE"), "lanes")
	sum := int64(0)
	for p := range int32(partitions) {
		c := max(committed[p], 0)
		sum += c
		n := e.count(`SELECT count(*) FROM effects WHERE part = $1`, p)
		inRange := e.count(`SELECT count(*) FROM effects WHERE part = $1 AND off < $2`, p, c)
		if int64(inRange) != c || (!lanes && inRange != n) {
			t.Errorf("partition %d: committed %d but has %d effects (%d below the committed offset); want effects for exactly offsets [0,%d)", p, c, n, inRange, c)
		}
	}
	if !lanes && sum != int64(done) {
		t.Errorf("committed offsets sum to %d, effects %d: finished messages were not committed at shutdown (or a gap was)", sum, done)
	}

	reg2 := prometheus.NewRegistry()
	cfg2 := e.config()
	cfg2.Registerer = reg2
	gate.open()
	start(t, cfg2, coreGatedHandler(gate))
	e.waitCommitted(e.topic, partitions, 90*time.Second)
	e.coreAssertOnePerKey(total)
	if got := coreOutcome(t, reg2, metrics.OutcomeProcessed); got != total-done {
		t.Errorf("after restart processed = %d, want %d", got, total-done)
	}
	// With lanes the finished messages above the committed offset come back
	// as duplicates; without, the shutdown committed every finished message.
	wantDup := 0
	if lanes {
		wantDup = done - int(sum)
	}
	if got := coreOutcome(t, reg2, metrics.OutcomeDuplicate); got != wantDup {
		t.Errorf("after restart duplicates = %d, want %d (finished messages above the committed offsets)", got, wantDup)
	}
}

// ---------------------------------------------------------------------------
// Configuration and start-up errors.

func coreValidConfig() consumer.Config {
	return consumer.Config{
		Brokers: []string{"127.0.0.1:9092"},
		Group:   "g",
		Topics:  []string{"t"},
		Dedupe:  dedupe.NewMemory(),
	}
}

// configFields returns the Field of every *consumer.ConfigError in err's tree.
func coreConfigFields(err error) []string {
	var out []string
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if ce, ok := err.(*consumer.ConfigError); ok {
			out = append(out, ce.Field)
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

func TestRunRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	if err := coreValidConfig().Validate(); err != nil {
		t.Fatalf("valid config: Validate = %v", err)
	}
	long := 2 * time.Minute // longer than sarama's default rebalance timeout (60s)
	cases := []struct {
		name   string
		mutate func(c *consumer.Config)
		fields []string // every field named, in order
	}{
		{"no brokers", func(c *consumer.Config) { c.Brokers = nil }, []string{"Brokers"}},
		{"broker without port", func(c *consumer.Config) { c.Brokers = []string{"localhost"} }, []string{"Brokers"}},
		{"blank broker", func(c *consumer.Config) { c.Brokers = []string{" "} }, []string{"Brokers"}},
		{"no group", func(c *consumer.Config) { c.Group = "" }, []string{"Group"}},
		{"blank group", func(c *consumer.Config) { c.Group = "  " }, []string{"Group"}},
		{"no topics", func(c *consumer.Config) { c.Topics = nil }, []string{"Topics"}},
		{"empty topic", func(c *consumer.Config) { c.Topics = []string{""} }, []string{"Topics"}},
		{"topic twice", func(c *consumer.Config) { c.Topics = []string{"t", "t"} }, []string{"Topics"}},
		{"no dedupe", func(c *consumer.Config) { c.Dedupe = nil }, []string{"Dedupe"}},
		{"negative MaxKeyLength", func(c *consumer.Config) { c.MaxKeyLength = -1 }, []string{"MaxKeyLength"}},
		{"unknown MissingKey", func(c *consumer.Config) { c.MissingKey = consumer.MissingKeyPolicy(9) }, []string{"MissingKey"}},
		{"negative ShutdownGrace", func(c *consumer.Config) { c.ShutdownGrace = -time.Second }, []string{"ShutdownGrace"}},
		{"ShutdownGrace above rebalance timeout", func(c *consumer.Config) { c.ShutdownGrace = long }, []string{"ShutdownGrace"}},
		{"negative CommitInterval", func(c *consumer.Config) { c.CommitInterval = -time.Second }, []string{"CommitInterval"}},
		{"negative OutageBackoff", func(c *consumer.Config) { c.OutageBackoff = -time.Second }, []string{"OutageBackoff"}},
		{"non-positive retry delay", func(c *consumer.Config) { c.Retry = retrytopic.Policy{Delays: []time.Duration{time.Second, 0}} }, []string{"Retry"}},
		{"negative RetryBase", func(c *consumer.Config) { c.RetryBase = -time.Millisecond }, []string{"RetryBase"}},
		{"RetryMax below RetryBase", func(c *consumer.Config) { c.RetryBase, c.RetryMax = time.Second, time.Millisecond }, []string{"RetryMax"}},
		{"two problems", func(c *consumer.Config) { c.Group, c.Dedupe = "", nil }, []string{"Group", "Dedupe"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := coreValidConfig()
			tc.mutate(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			h := handler.Func(func(context.Context, *handler.Message) error { return nil })
			err := consumer.Run(ctx, cfg, h)
			if !errors.Is(err, consumer.ErrInvalidConfig) {
				t.Fatalf("Run = %v, want an error wrapping ErrInvalidConfig", err)
			}
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("Run = %v: no *ConfigError in it", err)
			}
			if got := coreConfigFields(err); fmt.Sprint(got) != fmt.Sprint(tc.fields) {
				t.Errorf("fields named = %v, want %v (err: %v)", got, tc.fields, err)
			}
			for _, f := range tc.fields {
				if !strings.Contains(err.Error(), "Config."+f) {
					t.Errorf("error %q does not name Config.%s", err, f)
				}
			}
			if verr := cfg.Validate(); verr == nil || verr.Error() != err.Error() {
				t.Errorf("Validate = %v, Run = %v: want the same error", verr, err)
			}
		})
	}
}

func TestRunNilHandler(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := consumer.Run(ctx, coreValidConfig(), nil); !errors.Is(err, consumer.ErrNilHandler) {
		t.Fatalf("Run(nil handler) = %v, want ErrNilHandler", err)
	}
	// A nil func in the Func adapter is a nil handler too: accepted, it would
	// panic on every message and dead-letter the whole stream (kind "panic").
	// (No broker listens on port 1: Run must refuse before connecting.)
	var nilFunc handler.Func
	cfg := coreValidConfig()
	cfg.Brokers = []string{"127.0.0.1:1"}
	if err := consumer.Run(ctx, cfg, nilFunc); !errors.Is(err, consumer.ErrNilHandler) {
		t.Errorf("Run(handler.Func(nil)) = %v, want ErrNilHandler", err)
	}
}

func TestRunUnknownTopic(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	missing := testenv.Unique("t_missing")
	group := testenv.Group(t)
	t.Cleanup(func() {
		// In case the broker auto-created it; and idem's DLQ must not exist either.
		k.DeleteTopics(t, missing, missing+"."+group+".dlq")
	})
	cfg := consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{missing},
		Dedupe: dedupe.NewMemory(), Sarama: k.Config(),
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := consumer.Run(ctx, cfg, handler.Func(func(context.Context, *handler.Message) error { return nil }))
	if !errors.Is(err, consumer.ErrUnknownTopic) {
		t.Fatalf("Run = %v, want an error wrapping ErrUnknownTopic", err)
	}
	if !strings.Contains(err.Error(), missing) {
		t.Errorf("error %q does not name the topic %q", err, missing)
	}
	// Run must not have created the topic (through metadata auto-creation).
	ts, terr := k.Admin(t).ListTopics()
	if terr != nil {
		t.Fatal(terr)
	}
	for tn := range ts {
		if tn == missing || strings.HasPrefix(tn, missing+".") {
			t.Errorf("Run created topic %q; source topics must never be auto-created", tn)
		}
	}
}

// ---------------------------------------------------------------------------
// Poison messages.

// TestPoisonMessages: on one partition, in order: a record without the
// idempotency-key header, one whose handler panics, one with a 257-byte key,
// one with a 256-byte key, a tombstone, an ordinary record. The invalid-key
// and panic records go to <topic>.<group>.dlq with the right idem-error-kind;
// the others are processed; every offset is committed.
func TestPoisonMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	long := strings.Repeat("x", 257)
	limit := strings.Repeat("y", 256)
	hk := func(k string) []sarama.RecordHeader {
		return []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(k)}, {Key: []byte("trace"), Value: []byte("t-1")}}
	}
	recs := []*sarama.ProducerMessage{
		{Key: sarama.StringEncoder("no-key"), Value: sarama.StringEncoder("v0"), Headers: []sarama.RecordHeader{{Key: []byte("trace"), Value: []byte("t-0")}}},
		{Key: sarama.StringEncoder("boom"), Value: sarama.StringEncoder("v1"), Headers: hk("boom")},
		{Key: sarama.StringEncoder("long"), Value: sarama.StringEncoder("v2"), Headers: hk(long)},
		{Key: sarama.StringEncoder("limit"), Value: sarama.StringEncoder("v3"), Headers: hk(limit)},
		{Key: sarama.StringEncoder("tomb"), Value: nil, Headers: hk("tomb")},
		{Key: sarama.StringEncoder("ok"), Value: sarama.StringEncoder("v5"), Headers: hk("ok")},
	}
	p := e.k.Producer(t)
	for _, r := range recs {
		r.Topic, r.Partition = e.topic, 0
		if _, _, err := p.SendMessage(r); err != nil {
			t.Fatal(err)
		}
	}

	var (
		mu        sync.Mutex
		tombSeen  bool
		tombValue []byte
	)
	eff := effectHandler()
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		switch m.IdempotencyKey {
		case "boom":
			panic("boom: poison payload")
		case "tomb":
			mu.Lock()
			tombSeen, tombValue = true, m.Value
			if m.Value != nil {
				tombValue = append([]byte{}, m.Value...)
			}
			mu.Unlock()
		}
		return eff(ctx, m)
	})
	start(t, e.config(), h)
	e.waitCommitted(e.topic, 1, 60*time.Second)

	dlq := e.topic + "." + e.group + ".dlq"
	if end := e.endOffsets(dlq, 1)[0]; end != 3 {
		t.Errorf("DLQ %s holds %d records, want 3", dlq, end)
	}
	got := e.coreReadRecords(dlq, 0, 3, 30*time.Second)
	sortByOrigin(got) // lanes may dead-letter them in another order
	want := []struct {
		offset     int64
		key, value string
		kind       handler.Kind
	}{
		{0, "no-key", "v0", handler.KindMissingKey},
		{1, "boom", "v1", handler.KindPanic},
		{2, "long", "v2", handler.KindInvalidKey},
	}
	for i, w := range want {
		r := got[i]
		t.Run(fmt.Sprintf("dlq-%d-%s", i, w.kind), func(t *testing.T) {
			if string(r.Key) != w.key || string(r.Value) != w.value {
				t.Errorf("key/value = %q/%q, want %q/%q (raw bytes kept)", r.Key, r.Value, w.key, w.value)
			}
			check := func(h, want string) {
				t.Helper()
				if v, ok := coreHeader(r, h); !ok || v != want {
					t.Errorf("header %s = %q (present %v), want %q", h, v, ok, want)
				}
			}
			check(retrytopic.HeaderErrorKind, string(w.kind))
			check(retrytopic.HeaderOriginalTopic, e.topic)
			check(retrytopic.HeaderOriginalPartition, "0")
			check(retrytopic.HeaderOriginalOffset, strconv.FormatInt(w.offset, 10))
			check(retrytopic.HeaderConsumerGroup, e.group)
			if _, ok := coreHeader(r, "trace"); !ok {
				t.Errorf("original header %q was not kept", "trace")
			}
			stack, hasStack := coreHeader(r, retrytopic.HeaderStack)
			if w.kind == handler.KindPanic {
				if !hasStack || stack == "" {
					t.Errorf("panic record has no %s", retrytopic.HeaderStack)
				} else if len(stack) > retrytopic.MaxStackBytes {
					t.Errorf("%s is %d bytes, above the %d cap", retrytopic.HeaderStack, len(stack), retrytopic.MaxStackBytes)
				}
				if msg, _ := coreHeader(r, retrytopic.HeaderError); !strings.Contains(msg, "boom: poison payload") {
					t.Errorf("%s = %q, want the panic value", retrytopic.HeaderError, msg)
				}
			} else if hasStack {
				t.Errorf("%s present on a %s record", retrytopic.HeaderStack, w.kind)
			}
		})
	}

	if got := e.count(`SELECT count(*) FROM effects`); got != 3 {
		t.Errorf("effects = %d, want 3 (the 256-byte key, the tombstone, the ordinary record)", got)
	}
	if got := e.count(`SELECT count(*) FROM effects WHERE key = $1`, limit); got != 1 {
		t.Errorf("the record with a key of exactly MaxKeyLength (256 bytes) has %d effects, want 1", got)
	}
	if got := e.count(`SELECT count(*) FROM idem_processed WHERE idempotency_key = 'boom'`); got != 0 {
		t.Errorf("the panicking record left %d inbox rows, want 0", got)
	}
	mu.Lock()
	if !tombSeen {
		t.Error("the tombstone never reached the handler")
	} else if tombValue != nil {
		t.Errorf("tombstone: handler saw Value %q, want nil", tombValue)
	}
	mu.Unlock()
	if got := gatherSum(t, e.reg, "idem_missing_key_total", nil); got != 2 {
		t.Errorf("idem_missing_key_total = %v, want 2", got)
	}
	if got := gatherSum(t, e.reg, "idem_messages_total", map[string]string{"outcome": metrics.OutcomeDeadLettered}); got != 3 {
		t.Errorf("idem_messages_total{outcome=dead_lettered} = %v, want 3", got)
	}
}

// TestShutdownGraceCancelsInFlight: a handler still running ShutdownGrace
// after Run's ctx is cancelled has its ctx cancelled; its transaction rolls
// back, its offset is not committed (the finished message before it is), Run
// returns nil, and the restarted consumer handles the message.
func TestShutdownGraceCancelsInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce([]string{"g-0", "g-1", "g-2"}, 1)

	entered := make(chan struct{})
	var once sync.Once
	eff := effectHandler()
	stuck := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.IdempotencyKey != "g-1" {
			return eff(ctx, m)
		}
		// Write the effect, then hang until idem gives up on us.
		if err := eff(ctx, m); err != nil {
			return err
		}
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return ctx.Err()
	})
	cfg := e.config()
	cfg.ShutdownGrace = 300 * time.Millisecond
	r := start(t, cfg, stuck)
	select {
	case <-entered:
	case <-time.After(60 * time.Second):
		t.Fatal("the handler never reached g-1")
	}
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for stop in Cleanup
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its ctx was cancelled and the grace period passed")
	}
	if got := e.count(`SELECT count(*) FROM effects`); got != 1 {
		t.Errorf("effects = %d, want 1 (g-1's transaction must roll back)", got)
	}
	if got := e.count(`SELECT count(*) FROM idem_processed WHERE idempotency_key = 'g-1'`); got != 0 {
		t.Errorf("inbox rows for g-1 = %d, want 0", got)
	}
	if c := e.committed(e.topic, 1)[0]; c != 1 {
		t.Errorf("committed offset = %d, want 1 (g-0 finished, g-1 cancelled)", c)
	}
	if v := metricValue(t, e, "idem_abandoned_total", nil); v != 1 {
		t.Errorf("idem_abandoned_total = %v, want 1", v)
	}

	start(t, e.config(), effectHandler())
	e.waitCommitted(e.topic, 1, 60*time.Second)
	e.coreAssertOnePerKey(3)
}
