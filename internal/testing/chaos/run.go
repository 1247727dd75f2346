package chaos

import (
	"context"
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
