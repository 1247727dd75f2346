package payments

import (
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// This file is the demo's production: the stream of payments it builds
// (good, duplicate and bad records), the orders it seeds, and the producer
// that sends the stream at the asked rate.

func orderID(run string, i int) string { return fmt.Sprintf("%s-order-%06d", run, i) }
func payKey(run string, i int) string  { return fmt.Sprintf("%s-pay-%06d", run, i) }

// record is one Kafka record of the demo stream.
type record struct {
	kafkaKey string // "" → no key (any partition)
	key      string // idempotency-key header; "" → none
	value    []byte
	good     bool
}

type stream []record

func (st stream) good() int {
	n := 0
	for _, r := range st {
		if r.good {
			n++
		}
	}
	return n
}

// buildStream makes o.N good payments (one per order), round(o.N*o.Dup)
// duplicate deliveries of random ones, and o.Bad bad records, shuffled.
// Half the duplicates keep the order id as Kafka key (same partition, like a
// producer retry); the other half have no Kafka key and may land on another
// partition, so two consumers race on the same idempotency key.
func buildStream(run string, o demoOptions) stream {
	rnd := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 1))
	currs := []string{"KRW", "USD", "EUR", "JPY"}
	st := make(stream, 0, o.N+int(float64(o.N)*o.Dup+0.5)+o.Bad)
	for i := 1; i <= o.N; i++ {
		p := Payment{
			IdempotencyKey: payKey(run, i), OrderID: orderID(run, i), Currency: currs[rnd.IntN(len(currs))],
			Amount: Amount(fmt.Sprintf("%d.%02d", 1+rnd.IntN(100000), rnd.IntN(100))),
		}
		v, _ := json.Marshal(p)
		st = append(st, record{kafkaKey: p.OrderID, key: p.IdempotencyKey, value: v, good: true})
	}
	dups := int(float64(o.N)*o.Dup + 0.5)
	for d := range dups {
		r := st[rnd.IntN(o.N)]
		if d%2 == 1 {
			r.kafkaKey = ""
		}
		st = append(st, r)
	}
	for b := range o.Bad {
		key := fmt.Sprintf("%s-bad-%04d", run, b)
		var v string
		hdr := key
		switch b % 5 {
		case 0: // an order that does not exist
			v = fmt.Sprintf(`{"idempotency_key":%q,"order_id":"%s-order-missing-%d","amount":"10.00","currency":"KRW"}`, key, run, b)
		case 1: // poison bytes
			v = `{"idempotency_key":"` + key + `","order_id":` // truncated JSON
		case 2: // a refund disguised as a payment
			v = fmt.Sprintf(`{"idempotency_key":%q,"order_id":%q,"amount":"-5.00","currency":"USD"}`, key, orderID(run, 1+b%o.N))
		case 3: // a currency the service does not take
			v = fmt.Sprintf(`{"idempotency_key":%q,"order_id":%q,"amount":"7.50","currency":"XYZ"}`, key, orderID(run, 1+b%o.N))
		case 4: // no idempotency key anywhere
			v = fmt.Sprintf(`{"order_id":%q,"amount":"3.00","currency":"EUR"}`, orderID(run, 1+b%o.N))
			hdr = ""
		}
		st = append(st, record{kafkaKey: key, key: hdr, value: []byte(v)})
	}
	rnd.Shuffle(len(st), func(i, j int) { st[i], st[j] = st[j], st[i] })
	return st
}

// seedOrders inserts n pending orders for run.
func seedOrders(ctx context.Context, pool *pgxpool.Pool, run string, n int) error {
	rows := make([][]any, n)
	for i := range rows {
		rows[i] = []any{orderID(run, i+1)}
	}
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"id"}, pgx.CopyFromRows(rows)); err != nil {
		return fmt.Errorf("seed orders: %w", err)
	}
	return nil
}

// produce sends st to topic with an idempotent, acks=all producer, rate
// records a second (all at once when rate is 0), counting them in sent.
func produce(ctx context.Context, brokers []string, topic string, st stream, rate int, sent *atomic.Int64) error {
	cfg := saramaConfig("payments-demo-producer")
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.Retry.Max = 10
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer p.Close()
	// Batches of a tenth of a second's worth, each sent when it is due.
	batch, every := 1000, time.Duration(0)
	if rate > 0 {
		batch, every = max(1, rate/10), time.Duration(float64(time.Second)*float64(max(1, rate/10))/float64(rate))
	}
	start := time.Now()
	for i, n := 0, 0; i < len(st); i, n = i+batch, n+1 {
		if wait := time.Until(start.Add(time.Duration(n) * every)); wait > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("produce: %w", context.Cause(ctx))
			case <-time.After(wait):
			}
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("produce: %w", context.Cause(ctx))
		}
		msgs := make([]*sarama.ProducerMessage, 0, batch)
		for _, r := range st[i:min(i+batch, len(st))] {
			m := &sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(r.value)}
			if r.kafkaKey != "" {
				m.Key = sarama.StringEncoder(r.kafkaKey)
			}
			if r.key != "" {
				m.Headers = []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(r.key)}}
			}
			msgs = append(msgs, m)
		}
		if err := p.SendMessages(msgs); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		sent.Add(int64(len(msgs)))
	}
	return nil
}
