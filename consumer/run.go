package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/txn"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

// ErrUnknownTopic is wrapped by the error Run returns when a configured topic
// does not exist on the cluster (idem never auto-creates source topics).
var ErrUnknownTopic = errors.New("consumer: unknown topic")

// nilHandler is Run's error for a nil handler: it matches ErrInvalidConfig.
func nilHandler() error {
	errs := configerr.New(ErrInvalidConfig, "")
	errs.Bad("handler", nil, "Run needs one (handler.Batch(nil) and a nil handler.Func are nil)")
	return errs.Err()
}

// Run consumes cfg.Topics as group cfg.Group and passes every message through
// the dedupe store and h, until ctx is cancelled or a fatal error occurs.
//
// It blocks. On ctx cancellation it stops taking messages, lets in-flight ones
// finish within cfg.ShutdownGrace (then cancels them: their transactions roll
// back and they are redelivered later), commits the offsets of every finished
// message, and returns nil once every goroutine it started has ended. Any other
// return is a fatal error: an invalid Config or a nil handler (both match
// ErrInvalidConfig; handler.Batch(nil) and a nil handler.Func are nil),
// a missing topic (ErrUnknownTopic), a cluster that cannot be reached at start
// (a broker that refuses connections or times out is retried for up to 30 s
// first, so a service started during a broker restart or a leader move waits it
// out) or whose retry/dead-letter topics cannot be created, sarama refusing the
// configuration, or the dedupe store reporting its own configuration wrong (a
// *dedupe.StoreError with Op "config", met by the first message).
// Transient broker and database outages are not fatal: the affected partition
// waits and retries the same message (nothing is marked, nothing dropped) and
// Run keeps going.
//
// After every rebalance Run joins the group again. With the default
// cooperative-sticky assignor a rebalance only stops the partitions that move.
//
// A handler made by handler.Batch (any handler.BatchHandler) runs as a batch
// handler: the new messages of a batch (Config.Batch; MaxMessages, left 0,
// is 500 for it) are passed to its HandleBatch at once, in the batch's
// transaction, so it can write them with one statement. When a batch fails,
// it is rolled back and its messages run again alone, in order, each as a
// batch of one in its own transaction, so no message is committed before an
// earlier one of its lane reached its outcome; a message a
// *handler.BatchError names counts the failure named as its first attempt (a
// Permanent one goes to the dead-letter topic without running again). A
// failing message takes the same path as any other: in-process retries,
// retry tiers, the dead-letter topic.
func Run(ctx context.Context, cfg Config, h handler.Handler) error {
	if f, ok := h.(handler.Func); h == nil || ok && f == nil {
		if len(cfg.Routes) == 0 {
			return nilHandler()
		}
		h = nil // Config.Routes only: no default route (Config.Unmatched)
	}
	cfg, bh := forHandler(cfg, h)
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	r, err := newRunner(cfg, h)
	if err != nil {
		return err
	}
	r.bh = bh
	return r.run(ctx)
}

// batchHandlerMaxMessages is Config.Batch.MaxMessages's default for a batch
// handler (handler.Batch): see BatchConfig.MaxMessages.
const batchHandlerMaxMessages = 500

// forHandler returns h as a batch handler (nil if it is not one) and cfg
// with the defaults that depend on it: Batch.MaxMessages, left 0, is
// batchHandlerMaxMessages for a batch handler.
func forHandler(cfg Config, h handler.Handler) (Config, handler.BatchHandler) {
	bh, _ := h.(handler.BatchHandler)
	if bh != nil && cfg.Batch.MaxMessages == 0 && len(cfg.Routes) == 0 { // with routes, newRouteTable gives the default route its own
		cfg.Batch.MaxMessages = batchHandlerMaxMessages
	}
	return cfg, bh
}

// runner owns everything one Run call starts.
type runner struct {
	cfg    Config
	log    *slog.Logger
	m      *coremetrics.Metrics
	scfg   *sarama.Config
	group  sarama.ConsumerGroup
	policy retrytopic.Policy
	rules  *recovery.Policy // Config.Retry.Rules over the fallback rule; policy is the fallback's Retry
	shares *shares          // splits Config.Limits.Breakers' limits across the group (limits.go); nil without
	lanes  *lanesGate       // Config.Limits.Adaptive's member-wide limit (adaptive.go); nil without
	fwd    *forward.Forwarder
	txn    *txn.Owner // Transactions: every forward and offset commit; nil otherwise
	// refused remembers forwards refused in an aborted transaction
	// (Transactions; refusals.go); nil otherwise.
	refused *refusals
	order   *keyorder.Store // nil unless Ordering is ByKey
	routes  *routeTable     // the handlers and their policies (route.go)
	stepDB  dedupe.DB       // where durable steps record (steps.go); nil: nowhere
	// deferSealer seals deferred messages (Config.EncryptionKeyFile); nil:
	// stored in clear.
	deferSealer *seal.Sealer
	// owed keeps the hook calls (OnDeadLettered, Expiry.OnExpired) a
	// transaction owes until it has committed (settle.go); nil unless
	// Transactions and one of those hooks (any route's OnExpired).
	owed *keyorder.Store
	bh   handler.BatchHandler // a batch handler (handler.Batch); nil for any other
	// batchStore is cfg.Dedupe when it takes batches and Batch is on.
	batchStore dedupe.BatchStore
	pauses     *pauser
	gate       *gate
	ctl        *controls       // Config.Controls (control.go); nil without
	baseCtx    context.Context // values of Run's ctx, never cancelled: handler ctxs derive from it
	runCtx     context.Context // Run's ctx, also cancelled by fatal
	abort      context.CancelCauseFunc

	claims *claimSet // the claimed partitions, watched for stalls and lag
	keys   keyWatch  // warns when the first records of a topic have no key

	ready  *Readiness // Config.Readiness, or a private one
	life   *lifecycle // OnAssigned/OnRevoked
	tracer trace.Tracer
	// noRecord: the last span the tracer started neither recorded nor had
	// a valid context (no SDK installed); see spanStart.
	noRecord atomic.Bool
	wait     *delays

	// throttleLog is when (unix ns) throttleWait last logged at WARN.
	throttleLog atomic.Int64
}

func newRunner(cfg Config, h handler.Handler) (*runner, error) {
	m, err := coremetrics.New(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("consumer: register metrics: %w", err)
	}
	scfg := saramaConfig(cfg)
	if err := scfg.Validate(); err != nil {
		return nil, fmt.Errorf("consumer: sarama config: %w", err)
	}
	r := &runner{
		cfg: cfg,

		log:    cfg.Logger.With("group", cfg.Group),
		m:      m,
		scfg:   scfg,
		wait:   newDelays(cfg),
		policy: cfg.Retry.Tiers.WithDefaults(),
	}
	if err := registerLimits(cfg); err != nil {
		return nil, err
	}
	r.shares = newShares(cfg.Limits.Breakers)
	if r.lanes, err = newLanesGate(cfg.Limits.Adaptive, m.Lanes.WithLabelValues(cfg.Group)); err != nil {
		return nil, err
	}
	if cfg.Limits.Adaptive != nil {
		r.cfg.Concurrency = cfg.Limits.Adaptive.Max // Max lanes a partition; the gate decides how many run
	}
	if r.rules, err = cfg.recovery(); err != nil {
		return nil, fmt.Errorf("consumer: rules: %w", err)
	}
	if r.routes, err = newRouteTable(cfg, h, r.rules); err != nil {
		return nil, err
	}
	if bs, ok := cfg.Dedupe.(dedupe.BatchStore); ok && r.routes.batches {
		r.batchStore = bs
	}
	r.ready = cfg.Readiness
	if r.ready == nil {
		r.ready = NewReadiness()
	}
	r.claims = newClaimSet(cfg.Group, m, r.log)
	r.life = newLifecycle(r)
	r.tracer = cfg.TracerProvider.Tracer(tracerName)
	return r, nil
}

func (r *runner) run(ctx context.Context) (err error) {
	defer func() {
		// A ctx cancelled while Run starts (creating the retry topics,
		// migrating the ordering schema) is a shutdown like any other.
		if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
			err = nil
		}
	}()
	r.baseCtx = context.WithoutCancel(ctx)
	ctx, r.abort = context.WithCancelCause(ctx)
	defer r.abort(nil)
	r.runCtx = ctx
	r.ready.start(r.cfg.Group, storePing(r.cfg))
	defer r.ready.stop()

	st := setup{cfg: r.cfg, policy: r.policy, rules: r.rules, log: r.log, order: r.cfg.Ordering.keyed}
	var client sarama.Client
	err = st.retry(ctx, nil, "connecting to the cluster", func() (err error) {
		client, err = sarama.NewClient(r.cfg.Brokers, r.scfg)
		return err
	})
	if err != nil {
		return fmt.Errorf("consumer: connect to %v: %w", r.cfg.Brokers, err)
	}
	defer client.Close()
	if err := st.retry(ctx, client, "reading the topics' metadata", func() error { return checkTopics(client, r.cfg.Topics) }); err != nil {
		return err
	}
	st.warnRetention(client)
	st.warnIgnoredInitial()
	maxBytes, err := st.retryTopics(ctx, client)
	if err != nil {
		return err
	}
	// The forwarder's producer has a client of its own, so the consumer
	// group's rebalances and the producer's metadata never interfere. Its
	// Producer.MaxMessageBytes follows the largest max.message.bytes of the
	// source, tier and dead-letter topics (plus room for idem's headers).
	if r.cfg.Transactions.Enabled {
		tclient, err := memberTxn{r}.start(ctx, st, maxBytes)
		if err != nil {
			return err
		}
		defer tclient.Close()
		defer r.txn.Close() // aborts a transaction still open
	} else {
		pcfg := *r.scfg
		pcfg.Producer.MaxMessageBytes = max(pcfg.Producer.MaxMessageBytes, maxBytes)
		var pclient sarama.Client
		var fwd *forward.Forwarder
		err := st.retry(ctx, nil, "starting the forwarder's producer", func() (err error) {
			if pclient == nil {
				if pclient, err = sarama.NewClient(r.cfg.Brokers, &pcfg); err != nil {
					return err
				}
			}
			fwd, err = forward.NewForwarderFromClient(pclient)
			return err
		})
		if pclient != nil {
			defer pclient.Close()
		}
		if err != nil {
			return fmt.Errorf("consumer: forwarder's producer on %v: %w", r.cfg.Brokers, err)
		}
		defer fwd.Close()
		r.fwd = fwd
	}
	if r.cfg.Ordering.keyed {
		r.order = keyorder.New(r.cfg.Ordering.db, r.cfg.Group)
		if err := st.retry(ctx, nil, "creating the ordering schema", func() error { return r.order.Migrate(ctx) }); err != nil {
			return fmt.Errorf("consumer: ordering schema: %w", err)
		}
	}
	if err := r.sealPayloads(ctx, st); err != nil {
		return err
	}
	if r.txn != nil && (r.cfg.OnDeadLettered != nil || r.routes.onExpired()) {
		r.owed = keyorder.New(orderingDB(r.cfg), r.cfg.Group)
		if err := st.retry(ctx, nil, "creating the owed hooks' table", func() error { return r.owed.Migrate(ctx) }); err != nil {
			return fmt.Errorf("consumer: owed hooks' table: %w", err)
		}
	}
	st.warnUnread(ctx, client)
	group, err := sarama.NewConsumerGroupFromClient(r.cfg.Group, client)
	if err != nil {
		return fmt.Errorf("consumer: join group %s: %w", r.cfg.Group, err)
	}
	r.group = group
	r.pauses = newPauser(group, r.m.PartitionsPaused.MustCurryWith(prometheus.Labels{"group": r.cfg.Group}))
	var closeSteps func()
	r.stepDB, closeSteps = stepPool(r.cfg)
	defer closeSteps()
	r.gate = newGate(r)

	var wg sync.WaitGroup
	wg.Go(func() { // the group's error channel, owned here and drained until Close
		for err := range group.Errors() {
			if !errors.Is(err, context.Canceled) {
				r.log.Warn("idem: consumer group error", "err", err)
			}
		}
	})
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer func() {
		stopWatch()
		if err := group.Close(); err != nil {
			r.log.Warn("idem: close consumer group", "err", err)
		}
		r.gate.close() // every claim has ended: no cool-down timer fires after Run
		wg.Wait()
	}()

	wg.Go(func() { r.claims.watchLag(watchCtx, client, r.lagPlan(ctx)) })
	wg.Go(func() { watchDLQDepth(watchCtx, client, r.cfg, r.m.DLQDepth, r.log) })
	wg.Go(func() { r.claims.watchStalls(watchCtx, r.cfg.StallWarning) })
	wg.Go(func() { r.watchPool(watchCtx) })
	wg.Go(func() { sweep(watchCtx, r.cfg, r.log) })
	startFailureIndex(watchCtx, &wg, r.cfg, r.log)
	startScheduler(watchCtx, &wg, r.cfg, r.log)
	if err := r.startControls(ctx, watchCtx, &wg, st, client); err != nil {
		return err
	}
	r.shares.start(watchCtx, &wg, client, r)

	gh := &groupHandler{r: r}
	topics := subscribed(r.cfg)
	r.logStart()
	defer r.log.Info("idem: consumer stopped", "topics", r.cfg.Topics)
	for n := 1; ctx.Err() == nil; {
		err := group.Consume(ctx, topics, gh)
		switch {
		case errors.As(context.Cause(ctx), new(*fatalError)):
			return context.Cause(ctx)
		case ctx.Err() != nil:
		case errors.Is(err, sarama.ErrClosedConsumerGroup):
			return fmt.Errorf("consumer: %w", err)
		case err != nil:
			r.log.Warn("idem: consume failed; retrying", "err", err)
			sleep(ctx, r.wait.outage(n))
			n++
		default:
			n = 1
		}
	}
	return nil
}

// logStart logs, once the group is joined, what this Run consumes and how.
func (r *runner) logStart() {
	mode := "per-message"
	switch {
	case r.bh != nil:
		mode = "batch handler"
	case r.batchStore != nil:
		mode = "batched transactions"
	}
	r.log.Info("idem: consumer started", "topics", r.cfg.Topics, "mode", mode, "batch_max", r.cfg.Batch.MaxMessages,
		"lanes", r.cfg.Concurrency, "ordering", r.cfg.Ordering.String(), "tiers", r.policy.Delays,
		"dlq", r.policy.DLQ(r.cfg.Topics[0], r.cfg.Group), "key_func", r.cfg.KeyFunc.String(), "routes", r.routes.names())
}

// fatalError is the error Run returns when a partition met a failure no
// message can get past (classFatal).
type fatalError struct{ err error }

func (e *fatalError) Error() string { return "consumer: " + e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// fatal stops Run, which returns err: the dedupe store reported a
// configuration error, which every message would meet for ever.
func (r *runner) fatal(err error) {
	r.log.Error("idem: the dedupe store is misconfigured; stopping", "err", err)
	r.abort(&fatalError{err})
}
