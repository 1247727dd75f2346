package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/testing/chaos/check"
)

// Options configure one mode's run.
type Options struct {
	Services *Services
	Bin      string // the member binary (internal/testing/chaos/member: payments-consumer with the hooks)
	Dir      string // where the logs go (one subdirectory per mode)
	Workload Workload
	Seed     uint64

	ProduceFor   time.Duration // the producer spreads its records over this long
	KillEvery    time.Duration // a random member is SIGKILLed this often
	FreezeFor    time.Duration // the broker is SIGSTOPped this long (more than the session timeout)
	DrainTimeout time.Duration // how long the group may take to catch up after the faults
	// Transactions runs the members with Config.Transactions and the relay
	// with ExactlyOnce (modes per-message, batched, batch-handler), and
	// reads the DLQ, the tiers and the events as read_committed readers:
	// the checker then wants exactly one copy of each forward per hop.
	Transactions bool
	Logf         func(format string, args ...any)
}

// Members' settings the faults are sized against.
const (
	partitions     = 6
	retryDelays    = "500ms,2s"
	sessionTimeout = 10 * time.Second // sarama's default Consumer.Group.Session.Timeout
	errorGrace     = 30 * time.Second // ERROR lines allowed after an infrastructure fault ends
)

// Summary is what one mode's run measured.
type Summary struct {
	Mode     string
	Produced int
	Elapsed  time.Duration
	Faults   map[string]int
	// Injected are the run's faults other than the members' SIGKILLs, in
	// order, each with what it found (which node, how long the move took).
	Injected []check.Fault
	Report   *check.Report
}

// RunMode runs mode under faults and checks its history.
func RunMode(ctx context.Context, o Options, mode string) (*Summary, error) {
	start := time.Now()
	rnd := rand.New(rand.NewPCG(o.Seed, uint64(len(mode))))
	run := fmt.Sprintf("%x", rnd.Uint32())
	db := "chaos_" + strings.ReplaceAll(mode, "-", "_")
	topic, group := "payments-"+mode, "chaos-"+mode
	dir := filepath.Join(o.Dir, mode)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	svc := o.Services
	if err := svc.CreateDB(ctx, db); err != nil {
		return nil, err
	}
	events := topic + ".events"
	if svc.nodes() == 1 {
		for _, t := range []string{topic, events} {
			if err := createTopic(svc.Brokers(), t, 1, nil); err != nil {
				return nil, err
			}
		}
	} else if err := createClusterTopics(svc.Brokers(), topic, events, group); err != nil {
		return nil, err
	}
	recs, orders := plan(o.Workload, run, rnd)
	o.Logf("[%s] %d records planned (%d payments), topic %s, group %s, logs in %s", mode, len(recs), o.Workload.Payments, topic, group, dir)

	var infra sync.RWMutex
	env := append(os.Environ(), "KAFKA_BROKERS="+strings.Join(svc.Brokers(), ","), "DATABASE_URL="+svc.DatabaseURL(db))
	args := []string{"-topic", topic, "-group", group, "-partitions", fmt.Sprint(partitions), "-metrics-addr", "",
		"-mode", mode, "-retry-delays", retryDelays, "-fail-header", FailHeader, "-events-topic", events}
	if o.Transactions {
		args = append(args, "-transactions")
	}
	fl := newFleet(o.Bin, dir, args, env, &infra, func(f string, a ...any) { o.Logf("["+mode+"] "+f, a...) })
	faults := &faultLog{}
	defer fl.killAll()

	// One member first; the orders exist before any payment is sent.
	pool, err := firstMember(ctx, fl, svc.DatabaseURL(db), orders)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	down, err := startDownstream(ctx, svc.Brokers(), pool, events, group+"-downstream", filepath.Join(dir, "downstream.log"))
	if err != nil {
		return nil, err
	}
	var downProc *check.Proc
	defer func() {
		if downProc == nil {
			down.stop(nil)
		}
	}()

	// The producer, and the faults meanwhile.
	prodCtx, cancelProd := context.WithCancel(ctx)
	defer cancelProd()
	var produced []check.Produced
	var prodErr error
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		produced, prodErr = produce(prodCtx, svc.Brokers(), topic, recs, o.ProduceFor, filepath.Join(dir, "produced.jsonl"), o.Logf)
	}()
	slots := []string{"m1"}
	var slotsMu sync.Mutex
	active := func() []string { slotsMu.Lock(); defer slotsMu.Unlock(); return slices.Clone(slots) }
	killCtx, stopKills := context.WithCancel(ctx)
	killDone := make(chan struct{})
	go func() { defer close(killDone); fl.killLoop(killCtx, o.KillEvery, active, rnd, faults) }()

	T := o.ProduceFor
	at := func(frac float64) error { return sleep(ctx, time.Until(start.Add(time.Duration(frac*float64(T))))) }
	// step runs fault f at frac of the production; found, if given, says
	// what f found (which node), appended to the fault's detail.
	step := func(frac float64, kind, detail string, f func() error, found ...func() string) error {
		if err := at(frac); err != nil {
			return err
		}
		t0 := time.Now()
		o.Logf("[%s] fault: %s %s", mode, kind, detail)
		err := f()
		for _, fd := range found {
			if s := fd(); s != "" {
				detail += ": " + s
			}
		}
		faults.add(check.Fault{Kind: kind, Detail: detail, Start: t0, End: time.Now()})
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		return nil
	}
	outage := func(f func() error) func() error {
		return func() error { infra.Lock(); defer infra.Unlock(); return f() }
	}
	resize := func(frac float64, detail string, to []string) func() error {
		return func() error {
			return step(frac, "resize", detail, func() error {
				fl.membership.Lock()
				defer fl.membership.Unlock()
				slotsMu.Lock()
				from := slots
				slots = to
				slotsMu.Unlock()
				var errs []error
				for _, s := range to {
					if !slices.Contains(from, s) {
						errs = append(errs, fl.start(s))
					}
				}
				for _, s := range from {
					if !slices.Contains(to, s) {
						fl.stop(s, 40*time.Second)
					}
				}
				return errors.Join(errs...)
			})
		}
	}
	pgRestart := func(frac float64) func() error {
		return func() error {
			return step(frac, "pg-restart", "PostgreSQL stopped -m immediate and started", outage(func() error { return svc.RestartPG(ctx) }))
		}
	}
	var steps []func() error
	if svc.nodes() == 1 {
		steps = []func() error{
			resize(0.15, "group 1 → 3 members", []string{"m1", "m2", "m3"}),
			pgRestart(0.3),
			func() error {
				return step(0.5, "broker-restart", "broker SIGKILLed and started", outage(func() error {
					if err := svc.KillKafka(ctx); err != nil {
						return err
					}
					return svc.StartKafka(ctx)
				}))
			},
			func() error {
				return step(0.7, "broker-freeze", fmt.Sprintf("broker SIGSTOPped for %s (session timeout %s)", o.FreezeFor, sessionTimeout), outage(func() error {
					if err := svc.SignalKafka(syscall.SIGSTOP); err != nil {
						return err
					}
					serr := sleep(ctx, o.FreezeFor)
					return errors.Join(serr, svc.SignalKafka(syscall.SIGCONT))
				}))
			},
			resize(0.85, "group 3 → 2 members (m3 stopped with SIGTERM)", []string{"m1", "m2"}),
		}
	} else {
		// Three nodes: one node down is no outage (RF 3, min.insync 2), so
		// members keep starting and the infra lock is not taken; ERROR lines
		// are still excused during a broker fault and errorGrace after it.
		// A generator of its own: the kill loop's goroutine draws from rnd
		// meanwhile, and a rand.Rand is not safe for concurrent use.
		cf := &clusterFaults{svc: svc, rnd: rand.New(rand.NewPCG(o.Seed, uint64(len(mode))+1<<32)), source: topic, group: group, freeze: o.FreezeFor,
			logf: func(f string, a ...any) { o.Logf("["+mode+"] "+f, a...) }, timeout: time.Minute}
		txnDetail := "SIGKILL the transaction coordinator of a live member's transactional id, restart it after the move"
		if o.Transactions {
			cf.txnID = func(ctx context.Context) (string, string, error) {
				id, m, err := fl.liveTransactionalID(ctx, time.Minute)
				return id, "member " + m, err
			}
		} else {
			cf.txnID = func(context.Context) (string, string, error) {
				return group + "-txn", "no member's: they run without transactions", nil
			}
			txnDetail = "SIGKILL the transaction coordinator of transactional id " + group + "-txn" +
				" (the members run without transactions: no producer uses it), restart it after the move"
		}
		node := func(frac float64, kind, detail string, f func(context.Context) error) func() error {
			return func() error {
				cf.found = ""
				return step(frac, kind, detail, func() error { return f(ctx) }, func() string { return cf.found })
			}
		}
		steps = []func() error{
			resize(0.08, "group 1 → 3 members", []string{"m1", "m2", "m3"}),
			node(0.16, "leader-kill", "SIGKILL the leader of a source partition, restart it after the failover", cf.sourceLeader),
			pgRestart(0.26),
			node(0.32, "tier-leader-kill", "SIGKILL the leader of a tier or DLQ partition, restart it after the failover", cf.tierLeader),
			node(0.44, "coordinator-kill", "SIGKILL the group coordinator of "+group+", restart it after the move", cf.groupCoordinator),
			node(0.56, "txn-coordinator-kill", txnDetail, cf.txnCoordinator),
			node(0.66, "broker-freeze", fmt.Sprintf("SIGSTOP the leader of a source partition for %s (session timeouts: members %s, brokers 9s)", o.FreezeFor, sessionTimeout), cf.freezeLeader),
			resize(0.78, "group 3 → 2 members (m3 stopped with SIGTERM)", []string{"m1", "m2"}),
			node(0.82, "rolling-restart", "each node in turn stopped with SIGTERM and started, the next once all three answer", cf.rollingRestart),
		}
	}
	err = runSteps(steps...)
	if err != nil {
		cancelProd() // the run is void: do not wait for a producer that cannot finish
	}
	<-prodDone
	stopKills()
	<-killDone
	if err != nil {
		return nil, err
	}
	if prodErr != nil {
		return nil, fmt.Errorf("producer: %w", prodErr)
	}
	for _, s := range active() { // a member killed last is restarted by killLoop; one that died on its own is not
		if err := fl.start(s); err != nil {
			return nil, err
		}
	}
	o.Logf("[%s] produced %d records in %s; draining", mode, len(produced), time.Since(start).Round(time.Second))

	tiers := []string{topic + "." + group + ".retry.1", topic + "." + group + ".retry.2"}
	sources := []lagSource{{group, append([]string{topic}, tiers...)}, {group + "-downstream", []string{events}}}
	if err := drain(ctx, svc.Brokers(), pool, sources, stores{ordering: mode == "ordering"}, o.DrainTimeout); err != nil {
		o.Logf("[%s] %v", mode, err) // the lag invariant reports it
	}
	fl.close()
	for _, s := range fl.running() {
		fl.stop(s, 40*time.Second)
	}
	fl.wait()
	allFaults := faults.all()
	dp := down.stop(allFaults)
	downProc = &dp

	h, err := gather(ctx, svc.Brokers(), pool, mode, sources, dir, o.Transactions)
	if err != nil {
		return nil, err
	}
	if h.Events, err = gatherEvents(ctx, svc.Brokers(), pool, events, h.Payments, o.Transactions); err != nil {
		return nil, err
	}
	if o.Transactions {
		h.Transactional, h.Tiers = true, map[string][]check.DLQRecord{}
		for _, t := range tiers {
			if h.Tiers[t], err = readDLQ(svc.Brokers(), t, true); err != nil {
				return nil, err
			}
		}
	}
	h.Group, h.Topic = group, topic
	h.Produced = produced
	h.Faults = allFaults
	h.Procs = append(fl.Procs(h.Faults, errorGrace), dp)
	sum := &Summary{Mode: mode, Produced: len(produced), Elapsed: time.Since(start), Faults: map[string]int{}, Report: check.Check(h)}
	for _, f := range h.Faults {
		sum.Faults[f.Kind]++
		if f.Kind != "kill" {
			sum.Injected = append(sum.Injected, f)
		}
	}
	return sum, nil
}

// runSteps runs steps in order and stops at the first error.
func runSteps(steps ...func() error) error {
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// saramaConfig is the harness's own clients' config.
func saramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V4_0_0_0
	c.ClientID = "chaos-harness"
	return c
}

// createTopic creates topic with the run's partition count, replication
// factor rf and configs.
func createTopic(brokers []string, topic string, rf int16, configs map[string]*string) error {
	return createTopicN(brokers, topic, partitions, rf, configs)
}

// createTopicN creates topic with n partitions, replication factor rf and
// configs; an existing topic is left alone.
func createTopicN(brokers []string, topic string, n int32, rf int16, configs map[string]*string) error {
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	d := &sarama.TopicDetail{NumPartitions: n, ReplicationFactor: rf, ConfigEntries: configs}
	if err := admin.CreateTopic(topic, d, false); err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	// Creation is asynchronous: wait until the metadata lists the topic, so
	// that a member started next finds it.
	for deadline := time.Now().Add(30 * time.Second); ; {
		ds, err := admin.DescribeTopics([]string{topic})
		if err == nil && len(ds) == 1 && ds[0].Err == sarama.ErrNoError && len(ds[0].Partitions) == int(n) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s not in the metadata 30s after its creation", topic)
		}
		time.Sleep(100 * time.Millisecond) // polling interval
	}
}

// firstMember starts member m1, which creates the schema, and inserts the
// orders in the database at url, through the pool it returns.
func firstMember(ctx context.Context, fl *fleet, url string, orders []string) (*pgxpool.Pool, error) {
	if err := fl.start("m1"); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	if err := insertOrders(ctx, pool, orders); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// insertOrders waits for the first member to create the schema, then
// inserts the pending orders.
func insertOrders(ctx context.Context, pool *pgxpool.Pool, orders []string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := pool.Exec(ctx, `INSERT INTO orders (id) SELECT unnest($1::text[])`, orders)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("insert %d orders (did the first member create the schema?): %w", len(orders), err)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// lagSource is a group and the topics it reads.
type lagSource struct {
	group  string
	topics []string
}

// stores are the tables besides the outbox that must be empty at the end.
type stores struct {
	ordering bool // the ordering store (Ordering ByKey): heads and parked messages
	deferred bool // the deferred messages (Config.Defer) not yet published
}

// drain waits until every group has committed every record of its topics,
// the outbox is empty and the stores hold nothing of the group; stable
// over three polls a second apart. timeout is how long it may go without
// progress (drainLoop).
func drain(ctx context.Context, brokers []string, pool *pgxpool.Pool, sources []lagSource, st stores, timeout time.Duration) error {
	return drainLoop(ctx, func() (int64, int64, error) {
		lags, err := leftOver(ctx, brokers, pool, sources, st)
		left, done := int64(0), int64(0)
		for _, l := range lags {
			left += l.End - max(l.Committed, 0)
			done += max(l.Committed, 0)
		}
		return left, done, err
	}, timeout, drainCap*timeout, time.Second)
}

// drainCap bounds a drain that keeps making progress: at most this many
// times its stall timeout.
const drainCap = 4

// drainLoop polls probe every tick until it reports nothing left three
// times in a row. probe returns what is left (records not committed, rows
// left in the stores) and how far the group got (its committed offsets
// summed). A drain fails when it made no progress (less left than ever
// before, or committed further) for stall, or when it ran longer than cap:
// a group working through a long serial chain (one hot key, ordered,
// through every tier) drains slowly but is not stalled, and must not be
// reported as lag.
func drainLoop(ctx context.Context, probe func() (left, committed int64, err error), stall, cap, tick time.Duration) error {
	begin := time.Now()
	lastProgress := begin
	bestLeft, bestDone := int64(-1), int64(-1)
	stable := 0
	var last string
	for stable < 3 {
		now := time.Now()
		if now.Sub(lastProgress) > stall {
			return fmt.Errorf("not drained: no progress for %s (%s)", stall, last)
		}
		if now.Sub(begin) > cap {
			return fmt.Errorf("not drained after %s: %s", cap, last)
		}
		left, done, err := probe()
		switch {
		case err != nil:
			stable, last = 0, err.Error()
		case left > 0:
			stable, last = 0, fmt.Sprintf("%d left", left)
		default:
			stable++
		}
		if err == nil {
			if bestLeft < 0 || left < bestLeft || done > bestDone {
				lastProgress = time.Now()
			}
			if bestLeft < 0 || left < bestLeft {
				bestLeft = left
			}
			bestDone = max(bestDone, done)
		}
		if err := sleep(ctx, tick); err != nil {
			return err
		}
	}
	return nil
}

// leftOver is the lag of every source, plus the unpublished outbox rows and
// the rows of the stores st names, as pseudo-partitions.
func leftOver(ctx context.Context, brokers []string, pool *pgxpool.Pool, sources []lagSource, st stores) ([]check.Lag, error) {
	var all []check.Lag
	for _, s := range sources {
		lags, err := lagsOf(brokers, s.group, s.topics)
		if err != nil {
			return nil, err
		}
		all = append(all, lags...)
	}
	n, err := outboxLeft(ctx, pool)
	if err != nil {
		return nil, err
	}
	all = append(all, check.Lag{Topic: "outbox (rows not published)", End: n})
	if st.ordering {
		n, err := parkedCount(ctx, pool, sources[0].group)
		if err != nil {
			return nil, err
		}
		all = append(all, check.Lag{Topic: "ordering store (heads + parked)", End: n})
	}
	if st.deferred {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_deferred WHERE consumer_group = $1`, sources[0].group).Scan(&n); err != nil {
			return nil, err
		}
		all = append(all, check.Lag{Topic: "deferred store (not yet published)", End: n})
	}
	return all, nil
}

// parkedCount is the ordering store's heads and parked messages of group.
func parkedCount(ctx context.Context, pool *pgxpool.Pool, group string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idem_ordering_heads WHERE consumer_group = $1)
		+ (SELECT count(*) FROM idem_ordering_parked WHERE consumer_group = $1)`, group).Scan(&n)
	return n, err
}

// lagsOf is the group's committed offset and the end of each partition of
// topics (topics that do not exist are skipped: a tier nobody needed).
func lagsOf(brokers []string, group string, topics []string) ([]check.Lag, error) {
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, err
	}
	existing, err := client.Topics()
	if err != nil {
		return nil, err
	}
	req := map[string][]int32{}
	ends := map[string]map[int32]int64{}
	for _, t := range topics {
		if !slices.Contains(existing, t) {
			continue
		}
		ps, err := client.Partitions(t)
		if err != nil {
			return nil, err
		}
		ends[t] = map[int32]int64{}
		for _, p := range ps {
			end, err := client.GetOffset(t, p, sarama.OffsetNewest)
			if err != nil {
				return nil, err
			}
			ends[t][p] = end
			req[t] = append(req[t], p)
		}
	}
	resp, err := admin.ListConsumerGroupOffsets(group, req)
	if err != nil {
		return nil, err
	}
	var lags []check.Lag
	for _, t := range topics {
		for _, p := range req[t] {
			l := check.Lag{Topic: t, Partition: p, End: ends[t][p], Committed: -1}
			if b := resp.GetBlock(t, p); b != nil {
				l.Committed = b.Offset
			}
			// A transactional run's logs end with markers (and maybe
			// aborted records) a consumer never commits past.
			l.End = settledEnd(client, t, p, l.Committed, l.End)
			lags = append(lags, l)
		}
	}
	return lags, nil
}

// gather reads the run's outcome: the ledger, payments and orders from
// PostgreSQL, the DLQ and the lags from Kafka, the members' histories.
func gather(ctx context.Context, brokers []string, pool *pgxpool.Pool, mode string, sources []lagSource, dir string, committed bool) (*check.History, error) {
	h := &check.History{Mode: mode, Orders: map[string]string{}}
	var err error
	if h.Effects, err = readEffects(ctx, pool); err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT idempotency_key, order_id FROM payments`)
	if err != nil {
		return nil, err
	}
	h.Payments, err = pgx.CollectRows(rows, pgx.RowToStructByPos[check.Payment])
	if err != nil {
		return nil, fmt.Errorf("read payments: %w", err)
	}
	rows, err = pool.Query(ctx, `SELECT id, status FROM orders`)
	if err != nil {
		return nil, err
	}
	var id, status string
	if _, err := pgx.ForEachRow(rows, []any{&id, &status}, func() error { h.Orders[id] = status; return nil }); err != nil {
		return nil, fmt.Errorf("read orders: %w", err)
	}
	if h.DLQ, err = readDLQ(brokers, sources[0].topics[0]+"."+sources[0].group+".dlq", committed); err != nil {
		return nil, err
	}
	if h.Lags, err = leftOver(ctx, brokers, pool, sources, stores{ordering: mode == "ordering"}); err != nil {
		return nil, err
	}
	if h.Attempts, err = readHistories(dir); err != nil {
		return nil, err
	}
	return h, nil
}

// readEffects reads the chaos_effects ledger.
func readEffects(ctx context.Context, pool *pgxpool.Pool) ([]check.Effect, error) {
	rows, err := pool.Query(ctx, `SELECT id, idempotency_key, kafka_key, seq, member, topic, kpartition, koffset, attempt, at FROM chaos_effects`)
	if err != nil {
		return nil, err
	}
	es, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (check.Effect, error) {
		var e check.Effect
		err := r.Scan(&e.ID, &e.Key, &e.KafkaKey, &e.Seq, &e.Member, &e.Topic, &e.Partition, &e.Offset, &e.Attempt, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read chaos_effects: %w", err)
	}
	return es, nil
}

// readHistories reads the members' history files in dir.
func readHistories(dir string) ([]check.Attempt, error) {
	var all []check.Attempt
	files, _ := filepath.Glob(filepath.Join(dir, "*.history.jsonl"))
	for _, f := range files {
		as, err := readJSONLines[check.Attempt](f)
		if err != nil {
			return nil, err
		}
		all = append(all, as...)
	}
	return all, nil
}

// rawRecord is one record read back from a topic.
type rawRecord struct {
	partition int32
	offset    int64
	value     []byte
	headers   map[string]string // the last value of each header
}

// readDLQ reads every record of the dead-letter topic (or a retry tier),
// as a read_committed reader gets them when committed.
func readDLQ(brokers []string, dlq string, committed bool) ([]check.DLQRecord, error) {
	recs, err := readAll(brokers, dlq, committed)
	if err != nil {
		return nil, err
	}
	out := make([]check.DLQRecord, 0, len(recs))
	for _, r := range recs {
		d := check.DLQRecord{Partition: r.partition, Offset: r.offset, Seq: -1, Headers: r.headers}
		if s, ok := r.headers["chaos-seq"]; ok {
			fmt.Sscan(s, &d.Seq)
		}
		out = append(out, d)
	}
	return out, nil
}

// readAll reads every record of topic (none if it does not exist): as a
// read_committed reader gets them when committed (readCommitted), else
// all of them.
func readAll(brokers []string, topic string, committed bool) ([]rawRecord, error) {
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	topics, err := client.Topics()
	if err != nil || !slices.Contains(topics, topic) {
		return nil, err
	}
	if committed {
		return readTopicCommitted(client, topic)
	}
	return readTopic(client, topic)
}

// readTopic reads every record of topic.
func readTopic(client sarama.Client, topic string) ([]rawRecord, error) {
	c, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ps, err := client.Partitions(topic)
	if err != nil {
		return nil, err
	}
	var out []rawRecord
	for _, p := range ps {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, err
		}
		if end == 0 {
			continue
		}
		pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, err
		}
		for {
			var m *sarama.ConsumerMessage
			select {
			case m = <-pc.Messages():
			case <-time.After(30 * time.Second):
				pc.Close()
				return nil, fmt.Errorf("reading %s/%d: no record for 30s before offset %d", topic, p, end)
			}
			r := rawRecord{partition: p, offset: m.Offset, value: m.Value, headers: map[string]string{}}
			for _, hd := range m.Headers {
				r.headers[string(hd.Key)] = string(hd.Value)
			}
			out = append(out, r)
			if m.Offset+1 >= end {
				break
			}
		}
		pc.Close()
	}
	return out, nil
}

// readJSONLines decodes a JSON-lines file; a torn last line (a SIGKILLed
// writer) is skipped.
func readJSONLines[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var v T
		if json.Unmarshal(sc.Bytes(), &v) == nil {
			out = append(out, v)
		}
	}
	return out, sc.Err()
}
