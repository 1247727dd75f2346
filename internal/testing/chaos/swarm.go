package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/testing/chaos/check"
	"github.com/idemhq/idem/internal/testing/chaos/draw"
)

// The swarm (issue 28, "Prove every crossing"): RunSwarm runs one draw of
// package draw against the harness's own broker(s) and PostgreSQL: members
// built from the draw's configuration (internal/testing/chaos/swarmmember), the
// draw's records (planSwarm), its faults at their times (swarmFaults), a
// drain, and one check of the whole history.

// SwarmOptions configure one draw's run.
type SwarmOptions struct {
	Services *Services
	Bin      string // the swarm member (internal/testing/chaos/swarmmember)
	Dir      string // where the logs go (a subdirectory per run)
	// Run names the run's topics, group and database ([a-z0-9]; no other
	// run of the process may use it).
	Run          string
	DrainTimeout time.Duration
	// MemberEnv is more environment for the members, e.g. a mutation
	// switch for members built with -tags idem_mutate.
	MemberEnv []string
	Logf      func(format string, args ...any)
}

// SwarmResult is what one draw's run found.
type SwarmResult struct {
	Draw     *draw.Draw
	Produced int
	Elapsed  time.Duration
	Faults   map[string]int // injected, by kind
	// Injected are the faults in order, each with what it found.
	Injected []check.Fault
	Report   *check.Report
	Dir      string // the run's logs
}

// RunSwarm runs draw d and checks its history.
func RunSwarm(ctx context.Context, o SwarmOptions, d *draw.Draw) (*SwarmResult, error) {
	start := time.Now()
	logf := func(f string, a ...any) { o.Logf("["+o.Run+"] "+f, a...) }
	dir := filepath.Join(o.Dir, o.Run)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "draw.json"), []byte(d.JSON()+"\n"), 0o644); err != nil {
		return nil, err
	}
	svc := o.Services
	db := "swarm_" + o.Run
	m := &draw.Member{Config: d.Config, Topic: "sw-" + o.Run, Group: "g-" + o.Run, T0: start}
	if d.Config.Outbox {
		m.Events = m.Topic + ".events"
	}
	tiers, dlqs, err := m.Topics()
	if err != nil {
		return nil, err
	}
	if err := svc.CreateDB(ctx, db); err != nil {
		return nil, err
	}
	if err := createSwarmTopics(svc, m, tiers, dlqs); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "member.json")
	if err := writeJSON(cfgPath, m); err != nil {
		return nil, err
	}
	logf("%s; logs in %s", d.Summary(), dir)

	var infra sync.RWMutex
	env := append(os.Environ(), "KAFKA_BROKERS="+strings.Join(svc.Brokers(), ","), "DATABASE_URL="+svc.DatabaseURL(db))
	env = append(env, o.MemberEnv...)
	fl := newFleet(o.Bin, dir, []string{"-config", cfgPath}, env, &infra, logf)
	if d.Config.InstanceIDs {
		fl.instanceOf = swarmInstanceID
	}
	fl.allowErrors = allowedErrors(d)
	defer fl.killAll()
	if err := fl.start("m1"); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, svc.DatabaseURL(db))
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := waitSchema(ctx, pool); err != nil {
		return nil, err
	}
	slots := []string{"m1"}
	for i := 2; i <= d.Config.Members; i++ {
		s := "m" + strconv.Itoa(i)
		slots = append(slots, s)
		if err := fl.start(s); err != nil {
			return nil, err
		}
	}
	var down *downstream
	if d.Config.Outbox {
		if down, err = startDownstream(ctx, svc.Brokers(), pool, m.Events, m.Group+"-downstream", filepath.Join(dir, "downstream.log")); err != nil {
			return nil, err
		}
	}
	var downProc *check.Proc
	defer func() {
		if down != nil && downProc == nil {
			down.stop(nil)
		}
	}()

	recs := planSwarm(d, m, o.Run)
	logf("%d records planned, %d members, %d faults", len(recs), d.Config.Members, len(d.Faults))
	fs := newSwarmFaults(ctx, o, d, m, fl, &infra, slots, cfgPath, env, dir, dlqs[0], logf)
	defer fs.close()

	prodCtx, cancelProd := context.WithCancel(ctx)
	defer cancelProd()
	var produced []check.Produced
	var prodErr error
	prodDone := make(chan struct{})
	prodStart := time.Now()
	go func() {
		defer close(prodDone)
		produced, prodErr = produce(prodCtx, svc.Brokers(), m.Topic, recs, d.Workload.ProduceFor.D(), filepath.Join(dir, "produced.jsonl"), o.Logf)
	}()
	var join []draw.Fault
	for _, f := range d.Faults {
		if f.Kind == draw.FaultJoin {
			join = append(join, f)
			continue
		}
		at := prodStart.Add(time.Duration(f.At * float64(d.Workload.ProduceFor.D())))
		if f.AtT0 > 0 { // placed in a window of the draw, on the members' clock
			at = m.T0.Add(f.AtT0.D())
		}
		if err = sleep(ctx, time.Until(at)); err != nil {
			break
		}
		if err = fs.run(f); err != nil {
			break
		}
	}
	if err != nil {
		cancelProd()
	}
	<-prodDone
	if err != nil {
		return nil, err
	}
	if prodErr != nil {
		return nil, fmt.Errorf("producer: %w", prodErr)
	}
	for _, s := range fs.active() { // a member stopped by a fault that failed half-way is started again
		if err := fl.start(s); err != nil {
			return nil, err
		}
	}
	logf("produced %d records in %s; draining", len(produced), time.Since(start).Round(time.Second))

	sources := []lagSource{{m.Group, append([]string{m.Topic}, tiers...)}}
	if d.Config.Defer {
		sources[0].topics = append(sources[0].topics, m.DeferredTopic())
	}
	if d.Config.Outbox {
		sources = append(sources, lagSource{m.Group + "-downstream", []string{m.Events}})
	}
	st := stores{ordering: d.Config.Ordering, deferred: d.Config.Defer}
	joined := make(chan error, 1)
	go func() { // members joining mid-drain
		drainStart := time.Now()
		var errs []error
		for _, f := range join {
			if err := sleep(ctx, time.Until(drainStart.Add(time.Duration(f.At*float64(time.Second))))); err != nil {
				errs = append(errs, err)
				break
			}
			errs = append(errs, fs.run(f))
		}
		joined <- errors.Join(errs...)
	}()
	if err := drain(ctx, svc.Brokers(), pool, sources, st, o.DrainTimeout); err != nil {
		logf("%v", err) // the lag invariant reports it
	}
	if err := <-joined; err != nil {
		return nil, err
	}
	fl.close()
	var stops sync.WaitGroup
	for _, s := range fl.running() { // all at once: each may take its ShutdownGrace
		stops.Go(func() { fl.stop(s, 40*time.Second) })
	}
	stops.Wait()
	fl.wait()
	fs.close()
	fs.log.endOpen()
	allFaults := fs.log.all()
	var procs []check.Proc
	if down != nil {
		dp := down.stop(allFaults)
		downProc = &dp
		procs = append(procs, dp)
	}

	h, err := gatherSwarm(ctx, svc.Brokers(), pool, d, m, tiers, dlqs, sources, st, dir)
	if err != nil {
		return nil, err
	}
	h.Produced, h.Faults = produced, allFaults
	h.Procs = append(append(fl.Procs(allFaults, errorGrace), fs.procs(allFaults)...), procs...)
	res := &SwarmResult{Draw: d, Produced: len(produced), Elapsed: time.Since(start), Faults: map[string]int{}, Injected: allFaults,
		Report: check.Check(h), Dir: dir}
	for _, f := range allFaults {
		res.Faults[f.Kind]++
	}
	return res, nil
}

// refusedForward matches the ERROR lines of a forward the DLQ (or a tier)
// refuses for its size, and of its stub: the draw's oversized poison and
// big records cause them.
var refusedForward = `idem: (destination refuses the record for good|message dead-lettered as a (bare )?stub)`

// handlerPanicked matches the ERROR line of a handler's panic: the draw's
// panic poison causes it.
var handlerPanicked = `idem: handler panicked`

// allowedErrors matches the ERROR lines d's workload causes by design, or
// is nil.
func allowedErrors(d *draw.Draw) *regexp.Regexp {
	var alts []string
	if d.Config.DLQMaxBytes > 0 || d.Config.Tier1MaxBytes > 0 || slices.Contains(d.FaultKindsDrawn(), draw.FaultRefuse) {
		alts = append(alts, refusedForward)
	}
	if slices.Contains(d.Workload.Poison, "panic") {
		alts = append(alts, handlerPanicked)
	}
	if len(alts) == 0 {
		return nil
	}
	return regexp.MustCompile(`level=ERROR msg="(` + strings.Join(alts, "|") + `)`)
}

// swarmInstanceID is a slot's InstanceID: "i-<n>" for slot "m<n>" and its
// one-off twins ("m<n>~twin"), so that the group "<group>-i" with
// InstanceID "<n>" has the same transactional.id (the txn-id-collision
// fault).
func swarmInstanceID(slot string) string {
	base, _, _ := strings.Cut(slot, "~")
	return "i-" + strings.TrimPrefix(base, "m")
}

// createSwarmTopics creates the source topic (and the events topic), and
// the fallback DLQ with the draw's smaller max.message.bytes; on three
// nodes every tier, DLQ and the deferred topic too, with replication 3 and
// what idem would give them.
func createSwarmTopics(svc *Services, m *draw.Member, tiers, dlqs []string) error {
	brokers := svc.Brokers()
	n := int32(m.Partitions)
	rf := int16(1)
	base := map[string]*string{}
	if svc.nodes() == 3 {
		rf = clusterRF
		base["min.insync.replicas"] = new(clusterMinISR)
	}
	for _, t := range []string{m.Topic, m.Events} {
		if t == "" {
			continue
		}
		if err := createTopicN(brokers, t, n, rf, base); err != nil {
			return err
		}
	}
	fwd := map[string]*string{
		"max.message.bytes": new(strconv.FormatInt(1048588+forward.HeaderHeadroom, 10)), // Kafka's default max.message.bytes of the source
		"retention.ms":      new(strconv.FormatInt((7 * 24 * time.Hour).Milliseconds(), 10)),
	}
	for k, v := range base {
		fwd[k] = v
	}
	if m.Tier1MaxBytes > 0 { // before idem would create it with the source's limit
		t1 := maps.Clone(fwd)
		t1["max.message.bytes"] = new(strconv.Itoa(m.Tier1MaxBytes))
		if err := createTopicN(brokers, tiers[0], n, rf, t1); err != nil {
			return err
		}
	}
	small := maps.Clone(fwd)
	if m.DLQMaxBytes > 0 {
		small["max.message.bytes"] = new(strconv.Itoa(m.DLQMaxBytes))
		if err := createTopicN(brokers, dlqs[0], n, rf, small); err != nil {
			return err
		}
	}
	if svc.nodes() != 3 {
		return nil // idem creates the others as it does for a service
	}
	all := append(slices.Clone(tiers[min(len(tiers), boolInt(m.Tier1MaxBytes > 0)):]), dlqs...)
	if m.Defer {
		all = append(all, m.DeferredTopic())
	}
	for _, t := range all {
		if err := createTopicN(brokers, t, n, rf, fwd); err != nil {
			return err
		}
	}
	return nil
}

// waitSchema waits until the first member has created the chaos ledgers.
func waitSchema(ctx context.Context, pool *pgxpool.Pool) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := pool.Exec(ctx, `SELECT 1 FROM chaos_hooks, chaos_effects, idem_outbox LIMIT 0`)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the first member did not create the schema: %w", err)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// gatherSwarm reads a swarm run's outcome: the ledgers, every dead-letter
// topic and tier (as a read_committed reader with transactions), the
// events, the lags and the members' histories.
func gatherSwarm(ctx context.Context, brokers []string, pool *pgxpool.Pool, d *draw.Draw, m *draw.Member, tiers, dlqs []string,
	sources []lagSource, st stores, dir string) (*check.History, error) {
	c := d.Config
	h := &check.History{Swarm: true, Mode: "swarm", Group: m.Group, Topic: m.Topic, Transactional: c.Transactions, Ordering: c.Ordering,
		HookDLQ: c.HookDLQ, HookExpired: c.HookExpired, EventsOnce: c.OutboxEO, AdaptiveMax: c.AdaptiveMax, MaxAge: c.MaxAge.D(),
		ExpirySlack: 10 * time.Second, Tiers: map[string][]check.DLQRecord{}}
	if d.Has(draw.Slow) && (c.BatchSize > 0 || c.BatchHandler || c.AdaptiveMax > 0) {
		h.ExpirySlack = time.Minute // a batch's or a full limit's slow calls delay the next ones
	}
	var err error
	if h.Effects, err = readEffects(ctx, pool); err != nil {
		return nil, err
	}
	for _, t := range dlqs {
		recs, err := readDLQ(brokers, t, c.Transactions)
		if err != nil {
			return nil, err
		}
		for i := range recs {
			recs[i].Topic = t
		}
		h.DLQ = append(h.DLQ, recs...)
	}
	for _, t := range tiers {
		recs, err := readDLQ(brokers, t, c.Transactions)
		if err != nil {
			return nil, err
		}
		for i := range recs {
			recs[i].Topic = t
		}
		h.Tiers[t] = recs
	}
	if h.Hooks, err = readHooks(ctx, pool); err != nil {
		return nil, err
	}
	if h.Attempts, err = readHistories(dir); err != nil {
		return nil, err
	}
	if c.Outbox {
		var stored []check.Payment
		seen := map[string]bool{}
		for _, e := range h.Effects {
			if !seen[e.Key] {
				seen[e.Key] = true
				stored = append(stored, check.Payment{Key: e.Key})
			}
		}
		if h.Events, err = gatherEvents(ctx, brokers, pool, m.Events, stored, c.OutboxEO); err != nil {
			return nil, err
		}
	}
	if h.Lags, err = leftOver(ctx, brokers, pool, sources, st); err != nil {
		return nil, err
	}
	return h, nil
}

// readHooks reads the hooks' ledger.
func readHooks(ctx context.Context, pool *pgxpool.Pool) ([]check.Hook, error) {
	rows, err := pool.Query(ctx, `SELECT hook, seq, idempotency_key, topic, member, origin_topic, origin_partition, origin_offset, kind, at FROM chaos_hooks`)
	if err != nil {
		return nil, err
	}
	hs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (check.Hook, error) {
		var k check.Hook
		err := r.Scan(&k.Hook, &k.Seq, &k.Key, &k.Topic, &k.Member, &k.Origin.Topic, &k.Origin.Partition, &k.Origin.Offset, &k.Kind, &k.At)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("read chaos_hooks: %w", err)
	}
	return hs, nil
}

// writeJSON writes v to path.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
