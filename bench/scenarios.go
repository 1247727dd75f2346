package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
)

// Record limits of the slow scenarios, so `make bench` stays within 15
// minutes on a 2-core machine. The table prints each scenario's count.
const (
	pgLimit    = 100_000 // PostgreSQL scenarios: ~5k msg/s one transaction per message
	slowLimit  = 20_000  // 2 ms handler: 12 partitions × 500 msg/s
	lanesLimit = 100_000 // 2 ms handler, 16 lanes: up to 12 × 16 × 500 msg/s
)

// ioWait stands for an HTTP call in the I/O-bound scenarios.
const ioWait = 2 * time.Millisecond

// handlerBatch is the batch size of the batch handler scenario, and of
// "PostgreSQL alone" beside it.
const handlerBatch = 500

// The scenarios, in table order. To add one, copy the closest and change it;
// Consume must call e.Meter.Done(record timestamp) once per finished record
// (idem handlers call e.Done(m), which waits for the commit in latency mode)
// and return nil when ctx is cancelled.
func init() {
	register(Scenario{Name: "raw sarama", Ceiling: ceilingSarama, Consume: consumeRawSarama})
	register(Scenario{Name: "raw kgo", Ceiling: ceilingKgo, Consume: consumeRawKgo})
	register(Scenario{Name: "watermill", Consume: consumeWatermill})
	// The framework's own cost: what a user writes instead of idem with the
	// memory store, and idem's goal against it.
	register(Scenario{Name: "hand-written dedupe loop", Consume: consumeDedupeLoop})
	register(Scenario{Name: "idem memory", Versus: "hand-written dedupe loop", Goal: 1.0, Consume: func(ctx context.Context, e *Env) error {
		return consumer.Run(ctx, e.Idem(dedupe.NewMemory()), noop(e))
	}})
	register(Scenario{Name: "idem no store", Versus: "idem memory", Consume: func(ctx context.Context, e *Env) error {
		return consumer.Run(ctx, e.Idem(nopStore{}), noop(e))
	}})
	register(Scenario{Name: "idem memory 16 lanes", Versus: "idem memory", Consume: func(ctx context.Context, e *Env) error {
		cfg := e.Idem(dedupe.NewMemory())
		cfg.Concurrency = 16
		return consumer.Run(ctx, cfg, noop(e))
	}})
	register(Scenario{Name: "naive loop", Limit: pgLimit, PG: true, Naive: true, Consume: consumeNaive})
	register(Scenario{Name: "idem PG", Limit: pgLimit, PG: true, Consume: func(ctx context.Context, e *Env) error {
		return consumer.Run(ctx, e.Idem(dedupe.NewPostgres(e.Pool)), insertOne(e))
	}})
	register(Scenario{Name: "idem PG batched", Limit: pgLimit, PG: true, Breakdown: true, P99Goal: 100 * time.Millisecond, Consume: func(ctx context.Context, e *Env) error {
		cfg := e.Idem(dedupe.NewPostgres(e.Pool))
		cfg.Batch = consumer.BatchConfig{MaxMessages: 100}
		return consumer.Run(ctx, cfg, insertOne(e))
	}})
	register(Scenario{Name: "idem PG batch handler", Limit: pgLimit, PG: true, Versus: "PostgreSQL alone", Goal: 0.5, Consume: func(ctx context.Context, e *Env) error {
		cfg := e.Idem(dedupe.NewPostgres(e.Pool))
		cfg.Batch = consumer.BatchConfig{MaxMessages: handlerBatch}
		return consumer.Run(ctx, cfg, insertAll(e))
	}})
	// The database's own limit for the batch handler's work, no Kafka.
	register(Scenario{Name: "PostgreSQL alone", Limit: pgLimit, PG: true, NoKafka: true, Consume: consumePGAlone})
	// Transactional mode (Config.Transactions): the offsets commit in Kafka
	// transactions (one every CommitInterval), the member's only offset
	// writer; compared with the same scenario without it.
	register(Scenario{Name: "idem PG transactional", Limit: pgLimit, PG: true, Versus: "idem PG", Consume: func(ctx context.Context, e *Env) error {
		cfg := e.Idem(dedupe.NewPostgres(e.Pool))
		cfg.Transactions.Enabled = true
		return consumer.Run(ctx, cfg, insertOne(e))
	}})
	register(Scenario{Name: "idem PG batched transactional", Limit: pgLimit, PG: true, Versus: "idem PG batched", Consume: func(ctx context.Context, e *Env) error {
		cfg := e.Idem(dedupe.NewPostgres(e.Pool))
		cfg.Batch = consumer.BatchConfig{MaxMessages: 100}
		cfg.Transactions.Enabled = true
		return consumer.Run(ctx, cfg, insertOne(e))
	}})
	register(Scenario{Name: "idem 2 ms", Limit: slowLimit, Consume: func(ctx context.Context, e *Env) error {
		return consumer.Run(ctx, e.Idem(dedupe.NewMemory()), sleepy(e))
	}})
	register(Scenario{Name: "idem 2 ms 16 lanes", Limit: lanesLimit, Versus: "idem 2 ms", Consume: func(ctx context.Context, e *Env) error {
		cfg := e.Idem(dedupe.NewMemory())
		cfg.Concurrency = 16
		return consumer.Run(ctx, cfg, sleepy(e))
	}})

}

// noop is the no-op handler: it only reports the record done.
func noop(e *Env) handler.Handler {
	return handler.Func(func(_ context.Context, m *handler.Message) error {
		e.Done(m)
		return nil
	})
}

// sleepy waits ioWait, like a handler calling an HTTP service.
func sleepy(e *Env) handler.Handler {
	return handler.Func(func(ctx context.Context, m *handler.Message) error {
		select {
		case <-time.After(ioWait):
		case <-ctx.Done():
			return ctx.Err()
		}
		e.Done(m)
		return nil
	})
}

// insertOne inserts one business row through the inbox's transaction (e.Done
// counts the record once that transaction commits).
func insertOne(e *Env) handler.Handler {
	return handler.Func(func(ctx context.Context, m *handler.Message) error {
		start := time.Now()
		if _, err := dedupe.Tx(ctx).Exec(ctx, insertRow, e.Group, m.IdempotencyKey, m.Partition, m.Offset, len(m.Value)); err != nil {
			return fmt.Errorf("insert row: %w", err)
		}
		if e.phases != nil {
			e.phases.own(m.IdempotencyKey, start, time.Now())
		}
		e.Done(m)
		return nil
	})
}

// insertAll inserts the business rows of a whole batch with one unnest
// statement through the batch's transaction.
func insertAll(e *Env) handler.Handler {
	return handler.Batch(func(ctx context.Context, msgs []*handler.Message) error {
		keys := make([]string, len(msgs))
		parts := make([]int32, len(msgs))
		offs := make([]int64, len(msgs))
		lens := make([]int32, len(msgs))
		for i, m := range msgs {
			keys[i], parts[i], offs[i], lens[i] = m.IdempotencyKey, m.Partition, m.Offset, int32(len(m.Value))
		}
		if _, err := dedupe.Tx(ctx).Exec(ctx, insertRows, e.Group, keys, parts, offs, lens); err != nil {
			return fmt.Errorf("insert rows: %w", err)
		}
		for _, m := range msgs {
			e.Done(m)
		}
		return nil
	})
}

// nopStore remembers nothing: it isolates idem's pipeline from the memory
// store's map of every key (which grows with the record count).
type nopStore struct{}

func (nopStore) Process(ctx context.Context, _ dedupe.Record, fn func(context.Context) error) (dedupe.Outcome, error) {
	if err := fn(ctx); err != nil {
		return 0, err
	}
	return dedupe.Processed, nil
}

// groupFunc adapts a per-message function to sarama.ConsumerGroupHandler.
type groupFunc func(ctx context.Context, s sarama.ConsumerGroupSession, m *sarama.ConsumerMessage) error

func (groupFunc) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (groupFunc) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (f groupFunc) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-c.Messages():
			if !ok {
				return nil
			}
			if err := f(s.Context(), s, m); err != nil {
				return err
			}
		case <-s.Context().Done():
			return nil
		}
	}
}

// runGroup consumes e.Topic with a plain sarama consumer group until ctx ends.
func runGroup(ctx context.Context, e *Env, f groupFunc) error {
	g, err := sarama.NewConsumerGroup(e.Brokers, e.Group, e.Sarama())
	if err != nil {
		return fmt.Errorf("consumer group: %w", err)
	}
	defer g.Close()
	go func() {
		for range g.Errors() { // drained until Close
		}
	}()
	for ctx.Err() == nil {
		if err := g.Consume(ctx, []string{e.Topic}, f); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
			return fmt.Errorf("consume: %w", err)
		}
	}
	return nil
}

// consumeRawSarama is the ceiling: a no-op handler that marks each message.
func consumeRawSarama(ctx context.Context, e *Env) error {
	return runGroup(ctx, e, func(_ context.Context, s sarama.ConsumerGroupSession, m *sarama.ConsumerMessage) error {
		s.MarkMessage(m, "")
		e.Meter.Done(m.Timestamp)
		return nil
	})
}

// consumeRawKgo is the ceiling of a Go client on this broker: franz-go's
// kgo consumer group (its defaults: cooperative-sticky balancing, fetches of
// up to 50 MB), a no-op handler that marks each record, and autocommit of
// the marked offsets every 5 s and on leaving, as a consumer committing only
// what it handled would.
func consumeRawKgo(ctx context.Context, e *Env) error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(e.Brokers...),
		kgo.ClientID("idem-bench"),
		kgo.ConsumerGroup(e.Group),
		kgo.ConsumeTopics(e.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AutoCommitMarks(),
	)
	if err != nil {
		return fmt.Errorf("kgo client: %w", err)
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := fetches.Err0(); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("kgo fetch: %w", err)
		}
		for it := fetches.RecordIter(); !it.Done(); {
			r := it.Next()
			cl.MarkCommitRecords(r)
			e.Meter.Done(r.Timestamp)
		}
	}
}

// consumeDedupeLoop is what a user writes instead of idem with the memory
// store: the same sarama consumer group, the key idem's memory scenario
// uses (the last idempotency-key header, consumer.HeaderKey's), a
// mutex-guarded set of the keys seen in memory, the no-op handler for a new
// key (recorded after it, as idem does), then MarkMessage. The set keeps
// every key (idem's store keeps a window of 1,000,000, as many as the
// default run reads).
func consumeDedupeLoop(ctx context.Context, e *Env) error {
	var mu sync.Mutex
	seen := map[string]struct{}{}
	return runGroup(ctx, e, func(_ context.Context, s sarama.ConsumerGroupSession, m *sarama.ConsumerMessage) error {
		key := headerKey(m)
		mu.Lock()
		if _, dup := seen[key]; !dup {
			// the no-op handler runs here
			seen[key] = struct{}{}
		}
		mu.Unlock()
		s.MarkMessage(m, "")
		e.Meter.Done(m.Timestamp)
		return nil
	})
}

// consumePGAlone is the database's own limit for the batch handler's work,
// without Kafka: e.Partitions writers (the batch handler's member has one
// worker a partition, each holding a connection for its transaction) each
// commit transactions of handlerBatch new records, the round trips idem's
// batch path makes: BEGIN; the inbox INSERT of dedupe.Postgres's batches
// (pgInboxInsert, the keys in key order, RETURNING the new ones); the batch
// handler's unnest INSERT (insertRows); COMMIT. Each record counts once its
// COMMIT returns.
func consumePGAlone(ctx context.Context, e *Env) error {
	g, ctx := errgroup.WithContext(ctx)
	for w := range max(1, e.Partitions) {
		g.Go(func() error {
			for seq := 0; ctx.Err() == nil; seq += handlerBatch {
				if err := pgAloneBatch(ctx, e, int32(w), seq); err != nil {
					return ctxNil(ctx, err)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// pgAloneBatch writes one transaction of consumePGAlone: writer w's records
// seq … seq+handlerBatch-1.
func pgAloneBatch(ctx context.Context, e *Env, w int32, seq int) error {
	start := time.Now()
	keys := make([]string, handlerBatch)
	topics := make([]string, handlerBatch)
	parts := make([]int32, handlerBatch)
	offs := make([]int64, handlerBatch)
	lens := make([]int32, handlerBatch)
	for i := range keys {
		keys[i] = fmt.Sprintf("pg%d-%d", w, seq+i)
	}
	slices.Sort(keys) // dedupe.Postgres inserts a batch's keys in key order
	for i := range keys {
		topics[i], parts[i], offs[i], lens[i] = e.Topic, w, int64(seq+i), 200
	}
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	rows, err := tx.Query(ctx, pgInboxInsert, e.Group, keys, topics, parts, offs)
	if err != nil {
		return err
	}
	fresh := 0
	for rows.Next() {
		fresh++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if fresh != len(keys) {
		return fmt.Errorf("inbox: %d of %d keys new", fresh, len(keys))
	}
	if _, err := tx.Exec(ctx, insertRows, e.Group, keys, parts, offs, lens); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	for range keys {
		e.Meter.Done(start)
	}
	return nil
}

// pgInboxInsert is the inbox INSERT of dedupe.Postgres's batches on the
// plain inbox table (insertBatch in dedupe/batch.go).
const pgInboxInsert = `INSERT INTO idem_processed (consumer_group, idempotency_key, topic, "partition", "offset")` +
	` SELECT $1, k, t, p, o FROM unnest($2::text[], $3::text[], $4::int[], $5::bigint[]) WITH ORDINALITY AS u(k, t, p, o, n)` +
	` ORDER BY n ON CONFLICT (consumer_group, idempotency_key) DO NOTHING RETURNING idempotency_key`

// consumeNaive is the hand-written loop idem replaces: one transaction per
// message with the inbox insert and the business row, then the mark.
func consumeNaive(ctx context.Context, e *Env) error {
	return runGroup(ctx, e, func(ctx context.Context, s sarama.ConsumerGroupSession, m *sarama.ConsumerMessage) error {
		key := headerKey(m)
		tx, err := e.Pool.Begin(ctx)
		if err != nil {
			return ctxNil(ctx, err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
		tag, err := tx.Exec(ctx, `INSERT INTO idem_processed (consumer_group, idempotency_key, topic, "partition", "offset")`+
			` VALUES ($1, $2, $3, $4, $5) ON CONFLICT (consumer_group, idempotency_key) DO NOTHING`,
			e.Group, key, m.Topic, m.Partition, m.Offset)
		if err != nil {
			return ctxNil(ctx, err)
		}
		if tag.RowsAffected() == 1 {
			if _, err := tx.Exec(ctx, insertRow, e.Group, key, m.Partition, m.Offset, len(m.Value)); err != nil {
				return ctxNil(ctx, err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return ctxNil(ctx, err)
		}
		s.MarkMessage(m, "")
		e.Meter.Done(m.Timestamp)
		return nil
	})
}

// ctxNil hides errors caused by the end of the run.
func ctxNil(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// consumeWatermill is Watermill's Kafka subscriber with a no-op handler that
// acks each message (it waits for the ack before the partition's next one).
func consumeWatermill(ctx context.Context, e *Env) error {
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               e.Brokers,
		Unmarshaler:           wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: e.Sarama(),
		ConsumerGroup:         e.Group,
	}, watermill.NopLogger{})
	if err != nil {
		return fmt.Errorf("watermill subscriber: %w", err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, e.Topic)
	if err != nil {
		return fmt.Errorf("watermill subscribe: %w", err)
	}
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				return nil
			}
			ts, _ := wkafka.MessageTimestampFromCtx(m.Context())
			m.Ack()
			e.Meter.Done(ts)
		case <-ctx.Done():
			return nil
		}
	}
}
