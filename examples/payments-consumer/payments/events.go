package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/outbox"
)

// defaultEventsTopic is where the service publishes payment.recorded (flag
// -events-topic).
const defaultEventsTopic = "payments.events"

// PaymentRecorded is the event the service publishes, through the
// transactional outbox, for every payment it stores:
//
//	{"type":"payment.recorded","idempotency_key":"…","order_id":"…","amount":"12.34","currency":"KRW","recorded_at":"…"}
//
// Its Kafka key is the order id (events of one order stay in order); the
// relay adds idem-outbox-id and idempotency-key headers, so an idem consumer
// of payments.events applies each event once even if the relay sends it twice.
type PaymentRecorded struct {
	Type           string    `json:"type"` // "payment.recorded"
	IdempotencyKey string    `json:"idempotency_key"`
	OrderID        string    `json:"order_id"`
	Amount         string    `json:"amount"`
	Currency       string    `json:"currency"`
	RecordedAt     time.Time `json:"recorded_at"`
}

// enqueueRecorded inserts the payment.recorded event of p into the outbox in
// tx, the transaction that stores the payment: both commit or neither does.
func enqueueRecorded(ctx context.Context, tx pgx.Tx, topic, key string, p Payment) error {
	v, err := json.Marshal(PaymentRecorded{Type: "payment.recorded", IdempotencyKey: key, OrderID: p.OrderID,
		Amount: string(p.Amount), Currency: p.Currency, RecordedAt: time.Now().UTC()})
	if err != nil {
		return handler.Permanent(fmt.Errorf("encode payment.recorded: %w", err))
	}
	err = outbox.Enqueue(ctx, tx, outbox.Message{
		Topic:   topic,
		Key:     []byte(p.OrderID),
		Value:   v,
		Headers: []handler.Header{{Key: "event-type", Value: []byte("payment.recorded")}},
	})
	if err != nil {
		return fmt.Errorf("enqueue payment.recorded for %s: %w", key, err) // retriable
	}
	return nil
}

// eventFigures is what the demo reads back about the events it published.
type eventFigures struct {
	Topic     string // the run's events topic
	Published int64  // records on Topic
	Distinct  int64  // distinct payments they name
	Pending   int64  // outbox rows of Topic not yet published when counted
}

// check says whether every stored payment has exactly one event.
func (f eventFigures) check(stored int64) error {
	if f.Published != stored || f.Distinct != stored || f.Pending != 0 {
		return fmt.Errorf("events published %d (%d distinct payments, %d still in the outbox) != payments stored %d",
			f.Published, f.Distinct, f.Pending, stored)
	}
	return nil
}

func (f eventFigures) String() string {
	return fmt.Sprintf("%s payment.recorded (%s distinct payments) on %s", num(f.Published), num(f.Distinct), f.Topic)
}

// waitEvents waits until the outbox holds no row for f.Topic (the in-process
// relay published them all), then counts the topic's records and the
// distinct payments they name.
func waitEvents(ctx context.Context, pool *pgxpool.Pool, client sarama.Client, topic string) (eventFigures, error) {
	f := eventFigures{Topic: topic}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_outbox WHERE topic = $1 AND state = 'pending'`, topic).Scan(&f.Pending); err != nil {
			return f, fmt.Errorf("count outbox rows: %w", err)
		}
		if f.Pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return f, fmt.Errorf("waiting for %d events to be published: %w", f.Pending, context.Cause(ctx))
		case <-t.C:
		}
	}
	keys, err := readEventKeys(ctx, client, topic)
	if err != nil {
		return f, err
	}
	f.Distinct = int64(len(keys))
	for _, n := range keys {
		f.Published += n
	}
	return f, nil
}

// readEventKeys reads topic from the start to its end offsets and counts
// the events per payment idempotency key.
func readEventKeys(ctx context.Context, client sarama.Client, topic string) (map[string]int64, error) {
	ends, err := endOffsets(client, topic)
	if err != nil {
		return nil, err
	}
	c, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", topic, err)
	}
	defer c.Close()
	keys := map[string]int64{}
	for p, end := range ends {
		if end == 0 {
			continue
		}
		pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, fmt.Errorf("read %s/%d: %w", topic, p, err)
		}
		for off := int64(-1); off < end-1; {
			select {
			case m := <-pc.Messages():
				off = m.Offset
				var ev PaymentRecorded
				if err := json.Unmarshal(m.Value, &ev); err != nil || ev.Type != "payment.recorded" {
					pc.Close()
					return nil, errors.Join(fmt.Errorf("%s/%d@%d is not a payment.recorded event", topic, p, m.Offset), err)
				}
				keys[ev.IdempotencyKey]++
			case <-ctx.Done():
				pc.Close()
				return nil, fmt.Errorf("read %s: %w", topic, context.Cause(ctx))
			}
		}
		pc.Close()
	}
	return keys, nil
}

// eventsRelay is the service's outbox relay, which it runs next to the
// consumer as it runs its metrics server (startRelay): one on pool with the
// consumer's brokers, Sarama configuration, logger and registry when on,
// else nil (events then wait in idem_outbox for `idem outbox relay`). Its
// Health joins the service's readiness (readyFunc).
func eventsRelay(on bool, pool *pgxpool.Pool, brokers []string, scfg *sarama.Config, log *slog.Logger, reg prometheus.Registerer) *outbox.Relay {
	if !on {
		return nil
	}
	return &outbox.Relay{Pool: pool, Brokers: brokers, Sarama: scfg, Logger: log, Registerer: reg, Health: new(outbox.Health)}
}

// startRelay runs rl (nil: nothing) until ctx ends or stop is called; stop
// waits for it. The relay retries its start-up and every database or broker
// outage by itself; an error it returns (a configuration it refuses) is
// logged, and events wait in the outbox, visible in idem_outbox_pending and
// in the readiness.
func startRelay(ctx context.Context, rl *outbox.Relay, log *slog.Logger) (stop func()) {
	if rl == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := rl.Run(ctx); err != nil {
			log.Error("outbox relay stopped; events wait in the outbox until it runs again", "err", err)
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// readyFunc is the service's /readyz check: when the relay runs in this
// process, its Health, so that a relay that cannot run makes the service not
// ready even while consuming works (the events its handlers enqueue would
// pile up unseen); then the consumer's Readiness.
func readyFunc(ready *consumer.Readiness, rl *outbox.Relay) func(context.Context) error {
	return func(ctx context.Context) error {
		if rl != nil {
			if err := rl.Health.Err(); err != nil {
				return fmt.Errorf("outbox relay not running: %w", err)
			}
		}
		return ready.Check(ctx)
	}
}
