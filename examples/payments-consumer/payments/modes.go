package payments

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/step"
)

// The consumer's processing modes (-mode).
const (
	modePerMessage   = "per-message"   // one message per transaction (the default)
	modeBatched      = "batched"       // Config.Batch: many messages per transaction, handlePayment for each
	modeBatchHandler = "batch-handler" // handler.Batch(handlePayments): one statement per batch
	modeLanes        = "lanes"         // Config.Concurrency 16: keys of one partition in parallel
	modeOrdering     = "ordering"      // Config.Ordering ByKey(pool): per-key order across retry tiers
)

var modes = []string{modePerMessage, modeBatched, modeBatchHandler, modeLanes, modeOrdering}

// runOptions are the serve flags that choose how the consumer runs.
type runOptions struct {
	mode        string
	retryDelays string
	// transactions: Config.Transactions, and the relay (if any) in
	// exactly-once mode.
	transactions bool
	// instanceID: Config.InstanceID (static membership), empty for none.
	instanceID string
}

// addRunFlags declares the mode flags on fs.
func addRunFlags(fs *flag.FlagSet) *runOptions {
	o := &runOptions{}
	fs.StringVar(&o.mode, "mode", modePerMessage, "processing mode: "+strings.Join(modes, "|"))
	fs.StringVar(&o.retryDelays, "retry-delays", "1s,10s,1m", "delays of the retry tiers, comma-separated (empty: no tiers, failures go to the DLQ)")
	fs.BoolVar(&o.transactions, "transactions", false, "transactional mode: forwards and offsets commit in Kafka transactions (Config.Transactions), the outbox relay publishes exactly once (Relay.ExactlyOnce)")
	fs.StringVar(&o.instanceID, "instance-id", "", "static membership (Config.InstanceID): a stable id of this member, unique in the group; a member restarted with it within the session timeout gets its partitions back without a rebalance")
	return o
}

// retryTiers parses -retry-delays.
func (o *runOptions) retryTiers() ([]time.Duration, error) {
	var ds []time.Duration
	for _, s := range strings.Split(o.retryDelays, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return nil, usagef("-retry-delays: %q is not a positive duration", s)
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// run runs the consumer of cfg with svc's handlers, wrapped by hooks, in the
// chosen mode, and the outbox relay rl next to it (nil: none), until ctx
// ends.
func (o *runOptions) run(ctx context.Context, cfg consumer.Config, rl *outbox.Relay, pool *pgxpool.Pool, log *slog.Logger, svc *service, hooks Hooks) (err error) {
	delays, err := o.retryTiers()
	if err != nil {
		return err
	}
	cfg.Retry.Tiers.Delays = delays
	cfg.InstanceID = o.instanceID
	if o.transactions {
		cfg.Transactions.Enabled = true
		if rl != nil {
			rl.ExactlyOnce = true
		}
	}
	switch o.mode {
	case modePerMessage, modeBatchHandler:
	case modeBatched:
		cfg.Batch = consumer.BatchConfig{MaxMessages: 200}
	case modeLanes:
		cfg.Concurrency = 16
	case modeOrdering:
		cfg.Ordering = consumer.ByKey(pool)
	default:
		return usagef("-mode %q: want one of %s", o.mode, strings.Join(modes, ", "))
	}
	var h handler.Handler = handler.Func(svc.handlePayment)
	if o.mode == modeBatchHandler {
		h = handler.Batch(svc.handlePayments)
	}
	if hooks.Wrap != nil {
		var done func() error
		h, done, err = hooks.Wrap(ctx, o.mode, pool, h)
		if err != nil {
			return err
		}
		if done != nil {
			defer func() { err = errors.Join(err, done()) }()
		}
	}
	log.Info("mode", "mode", o.mode, "retry_delays", delays)
	defer startRelay(ctx, rl, log)()
	return consumer.Run(ctx, cfg, h)
}

// handlePayments is the batch form of handlePayment, for handler.Batch:
// the batch's valid payments are inserted with one statement and their
// orders marked paid with another; then each payment stored is charged at the
// bank, a durable step of its message (step.For names it in the batch), and
// enqueues its payment.recorded event in the batch's transaction. A
// message that cannot be applied is named in a *handler.BatchError with the
// error handlePayment would return; idem then commits the others without it.
func (s *service) handlePayments(ctx context.Context, msgs []*handler.Message) error {
	if !dedupe.HasTx(ctx) {
		return errNoTx
	}
	tx := dedupe.Tx(ctx)
	be := &handler.BatchError{}
	var keys, orders, amounts, currencies []string
	valid := make([]*handler.Message, 0, len(msgs))
	payment := make(map[*handler.Message]Payment, len(msgs))
	seen := make(map[string]bool, len(msgs))
	for _, m := range msgs {
		p, err := decodePayment(m.Value)
		if err != nil {
			be.Add(m, handler.Decode(err))
			continue
		}
		if err := p.validate(); err != nil {
			be.Add(m, handler.Permanent(err))
			continue
		}
		if seen[p.OrderID] {
			// Two payments of one order in one batch: the first one wins.
			be.Add(m, handler.Permanent(fmt.Errorf("order %q is paid by an earlier payment of this batch: payment %s would charge it twice", p.OrderID, m.IdempotencyKey)))
			continue
		}
		seen[p.OrderID] = true
		valid = append(valid, m)
		payment[m] = p
		keys, orders = append(keys, m.IdempotencyKey), append(orders, p.OrderID)
		amounts, currencies = append(amounts, string(p.Amount)), append(currencies, p.Currency)
	}
	if len(valid) > 0 {
		inserted, err := collectSet(ctx, tx, `
			INSERT INTO payments (idempotency_key, order_id, amount, currency, status)
			SELECT k, o, a::numeric, c, 'captured' FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS t(k, o, a, c)
			ON CONFLICT (idempotency_key) DO NOTHING
			RETURNING idempotency_key`, keys, orders, amounts, currencies)
		if err != nil {
			return fmt.Errorf("insert %d payments: %w", len(keys), err) // retriable: the batch runs again message by message
		}
		paid, err := collectSet(ctx, tx, `
			UPDATE orders SET status = 'paid', paid_at = now()
			WHERE id = ANY($1::text[]) AND status = 'pending'
			RETURNING id`, orders)
		if err != nil {
			return fmt.Errorf("mark %d orders paid: %w", len(orders), err)
		}
		for _, m := range valid {
			p := payment[m]
			switch {
			case !inserted[m.IdempotencyKey]:
				// This very payment was applied before: its event was enqueued then.
				s.naturalDups.Add(1)
			case paid[p.OrderID]:
				if err := s.charge(step.For(ctx, m), p); err != nil { // the step of m
					be.Add(m, fmt.Errorf("charge payment %s: %w", m.IdempotencyKey, err))
					continue
				}
				if err := enqueueRecorded(ctx, tx, s.eventsTopic, m.IdempotencyKey, p); err != nil {
					return err
				}
			default:
				be.Add(m, orderRefusal(ctx, tx, p.OrderID, m.IdempotencyKey))
			}
		}
	}
	if len(be.Failed) > 0 {
		return be
	}
	return nil
}

// orderRefusal explains why a new payment could not mark its order paid.
func orderRefusal(ctx context.Context, tx pgx.Tx, order, key string) error {
	var status string
	switch err := tx.QueryRow(ctx, `SELECT status FROM orders WHERE id = $1`, order).Scan(&status); {
	case errors.Is(err, pgx.ErrNoRows):
		return handler.Permanent(fmt.Errorf("unknown order %q", order))
	case err != nil:
		return fmt.Errorf("look up order %s: %w", order, err)
	default:
		return handler.Permanent(fmt.Errorf("order %q is %s: payment %s would charge it twice", order, status, key))
	}
}

// collectSet runs a query returning one text column and returns its values.
func collectSet(ctx context.Context, tx pgx.Tx, sql string, args ...any) (map[string]bool, error) {
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	vals, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	set := make(map[string]bool, len(vals))
	for _, v := range vals {
		set[v] = true
	}
	return set, nil
}
