package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/testing/chaos/check"
)

// Workload sizes what the producer sends.
type Workload struct {
	Payments  int     // unique payments (each pays its own order)
	Customers int     // Kafka keys the payments spread over
	DupRate   float64 // share of payments delivered a second time
	Poison    float64 // poison records per payment
	Rivals    float64 // share of payments followed by a second payment of the same order
	Flaky     float64 // share of payments whose first attempts fail (injected)
	Huge      float64 // share of valid payments carrying ~200 KiB of headers
}

// record is one planned record: what the checker expects and what is sent.
type record struct {
	check.Produced
	headers []sarama.RecordHeader
	value   []byte
	// hasDeadline: the producer adds an idem-deadline header of deadlineIn
	// after the moment it sends the record.
	deadlineIn  time.Duration
	hasDeadline bool
}

// message is rec as sent to topic at now: with its timestamp, and its
// deadline counted from now.
func (rec *record) message(topic string, now time.Time) *sarama.ProducerMessage {
	hs := rec.headers
	if rec.hasDeadline {
		hs = append(slices.Clip(hs), sarama.RecordHeader{Key: []byte("idem-deadline"), Value: []byte(strconv.FormatInt(now.Add(rec.deadlineIn).UnixMilli(), 10))})
	}
	return &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(rec.KafkaKey), Value: sarama.ByteEncoder(rec.value), Headers: hs, Timestamp: now}
}

// FailHeader is the header whose value N makes the members fail a message's
// first N attempts (the member's -fail-header, internal/testing/chaos/member).
const FailHeader = "chaos-fail"

// plan lays out the records to send, in order, and the orders to create.
func plan(w Workload, run string, rnd *rand.Rand) (recs []record, orders []string) {
	var seq int64
	later := map[int][]record{} // records scheduled after position i
	emit := func(r record) {
		r.Seq = seq
		seq++
		r.headers = append(r.headers, sarama.RecordHeader{Key: []byte("chaos-seq"), Value: []byte(strconv.FormatInt(r.Seq, 10))})
		if r.FailFirst > 0 {
			r.headers = append(r.headers, sarama.RecordHeader{Key: []byte(FailHeader), Value: []byte(strconv.Itoa(r.FailFirst))})
		}
		recs = append(recs, r)
	}
	payment := func(kind string, key, order, customer string) record {
		r := record{Produced: check.Produced{Kind: kind, Expect: check.ExpectEffect, Key: key, KafkaKey: customer, Order: order}}
		r.headers = []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(key)}}
		r.value = fmt.Appendf(nil, `{"idempotency_key":%q,"order_id":%q,"amount":"%d.%02d","currency":"KRW"}`, key, order, 1+rnd.IntN(99999), rnd.IntN(100))
		return r
	}
	poisonKinds := []string{"empty-key", "long-key", "bad-utf8-key", "truncated-json", "bad-utf8-body", "huge-headers-poison", "unknown-order"}
	npoison := 0
	for i := range w.Payments {
		customer := fmt.Sprintf("cust-%d", rnd.IntN(w.Customers))
		key, order := fmt.Sprintf("pay-%s-%d", run, i), fmt.Sprintf("ord-%s-%d", run, i)
		orders = append(orders, order)
		r := payment("payment", key, order, customer)
		switch x := rnd.Float64(); {
		case x < w.Flaky/4:
			r.FailFirst = 5 // past the in-process retries: through a retry tier
		case x < w.Flaky:
			r.FailFirst = 2
		}
		if rnd.Float64() < w.Huge {
			r.Kind = "huge-headers"
			r.headers = append(r.headers, hugeHeaders()...)
		}
		switch y := rnd.Float64(); {
		case y < w.Rivals:
			r.Expect = check.ExpectRival
			rv := payment("rival", key+"-rival", order, customer)
			rv.Expect = check.ExpectRival
			at := i + 1 + rnd.IntN(50)
			later[at] = append(later[at], rv)
		case y < w.Rivals+w.DupRate:
			dup := r
			dup.Kind = "duplicate"
			dup.headers = append([]sarama.RecordHeader(nil), r.headers...)
			at := i + 1 + rnd.IntN(300)
			later[at] = append(later[at], dup)
		}
		emit(r)
		if r.Expect == check.ExpectRival {
			// Link the pair: the rival is emitted later; fix both ends then.
			recs[len(recs)-1].Rival = -1
		}
		for _, d := range later[i] {
			emit(d)
			if d.Kind == "rival" {
				linkRival(recs, len(recs)-1)
			}
		}
		delete(later, i)
		for float64(npoison) < w.Poison*float64(i+1) {
			emit(poison(poisonKinds[npoison%len(poisonKinds)], run, npoison, customer))
			npoison++
		}
	}
	for i := w.Payments; len(later) > 0; i++ {
		for _, d := range later[i] {
			emit(d)
			if d.Kind == "rival" {
				linkRival(recs, len(recs)-1)
			}
		}
		delete(later, i)
	}
	return recs, orders
}

// linkRival pairs the rival at recs[i] with the payment it competes with.
func linkRival(recs []record, i int) {
	for j := i - 1; j >= 0; j-- {
		if recs[j].Order == recs[i].Order && recs[j].Kind != "rival" {
			recs[j].Rival, recs[i].Rival = recs[i].Seq, recs[j].Seq
			return
		}
	}
}

// hugeHeaders is ~200 KiB of headers in 20 values.
func hugeHeaders() []sarama.RecordHeader {
	hs := make([]sarama.RecordHeader, 20)
	for i := range hs {
		hs[i] = sarama.RecordHeader{Key: fmt.Appendf(nil, "chaos-pad-%d", i), Value: []byte(strings.Repeat("x", 10<<10))}
	}
	return hs
}

// poison builds a record no retry can fix, and the DLQ kind it must get.
func poison(kind, run string, n int, customer string) record {
	key := fmt.Sprintf("poison-%s-%d", run, n)
	body := fmt.Appendf(nil, `{"idempotency_key":%q,"order_id":"ord-%s-0","amount":"1.00","currency":"KRW"}`, key, run)
	r := record{Produced: check.Produced{Kind: kind, Expect: check.ExpectDLQ, Key: key, KafkaKey: customer}}
	hdr := func(k string) {
		r.headers = append(r.headers, sarama.RecordHeader{Key: []byte("idempotency-key"), Value: []byte(k)})
	}
	switch kind {
	case "empty-key": // no header, no key in the body
		r.Key, r.DLQKind = "", "missing-key"
		hdr("")
		body = []byte(`{"order_id":"x","amount":"1.00","currency":"KRW"}`)
	case "long-key":
		r.Key, r.DLQKind = "", "invalid-key"
		hdr(strings.Repeat("k", 300))
	case "bad-utf8-key":
		r.Key, r.DLQKind = "", "invalid-key"
		hdr("pay-\xff\xfe-" + key)
	case "truncated-json":
		r.DLQKind = "decode"
		hdr(key)
		body = body[:len(body)/2]
	case "bad-utf8-body": // decodes (to U+FFFD) but the currency is not one the service accepts
		r.DLQKind = "permanent"
		hdr(key)
		body = fmt.Appendf(nil, `{"idempotency_key":%q,"order_id":"ord-%s-0","amount":"1.00","currency":"K`+"\xff\xfe"+`W"}`, key, run)
	case "huge-headers-poison":
		r.DLQKind = "decode"
		hdr(key)
		r.headers = append(r.headers, hugeHeaders()...)
		body = body[:len(body)-3]
	case "unknown-order":
		r.DLQKind = "permanent"
		hdr(key)
		body = fmt.Appendf(nil, `{"idempotency_key":%q,"order_id":"no-such-order-%d","amount":"1.00","currency":"KRW"}`, key, n)
	}
	r.value = body
	return r
}

// produce sends recs to topic, spread evenly over d, retrying each record
// until the broker acknowledges it (through broker restarts and freezes). It
// appends each acknowledged record to the file log and returns them all.
func produce(ctx context.Context, brokers []string, topic string, recs []record, d time.Duration, logPath string, logf func(string, ...any)) ([]check.Produced, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	defer w.Flush()

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_0_0_0
	cfg.ClientID = "chaos-producer"
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Retry.Max = 10
	cfg.Producer.Retry.Backoff = 250 * time.Millisecond
	cfg.Producer.MaxMessageBytes = 1 << 20
	cfg.Net.MaxOpenRequests = 1
	// A new producer after each failure: an idempotent producer whose
	// batches failed may be left with sequence numbers the broker refuses.
	var p sarama.SyncProducer
	connect := func() error {
		if p != nil {
			_ = p.Close()
			p = nil
		}
		for {
			if p, err = sarama.NewSyncProducer(brokers, cfg); err == nil {
				return nil
			}
			if err := sleep(ctx, time.Second); err != nil {
				return err
			}
		}
	}
	if err := connect(); err != nil {
		return nil, err
	}
	defer func() {
		if p != nil {
			p.Close()
		}
	}()

	out := make([]check.Produced, 0, len(recs))
	const chunk = 100
	start := time.Now()
	for i := 0; i < len(recs); i += chunk {
		// Pace: record i goes out at start + d*i/len.
		if wait := time.Until(start.Add(time.Duration(float64(d) * float64(i) / float64(len(recs))))); wait > 0 {
			if err := sleep(ctx, wait); err != nil {
				return out, err
			}
		}
		batch := recs[i:min(i+chunk, len(recs))]
		msgs := make([]*sarama.ProducerMessage, len(batch))
		now := time.Now().Truncate(time.Millisecond) // a record's timestamp is in milliseconds
		for j := range batch {
			msgs[j] = batch[j].message(topic, now)
		}
		for len(msgs) > 0 {
			err := p.SendMessages(msgs)
			failed := map[*sarama.ProducerMessage]bool{}
			var perrs sarama.ProducerErrors
			if errors.As(err, &perrs) {
				for _, pe := range perrs {
					failed[pe.Msg] = true
				}
				err = perrs[0].Err
			} else if err != nil {
				for _, m := range msgs {
					failed[m] = true
				}
			}
			var again []*sarama.ProducerMessage
			for _, m := range msgs {
				if failed[m] {
					again = append(again, m)
					continue
				}
				seq := seqOfMsg(m)
				r := recs[seq].Produced
				r.Topic, r.Partition, r.Offset, r.At, r.Timestamp = topic, m.Partition, m.Offset, time.Now(), m.Timestamp
				if recs[seq].hasDeadline {
					r.Deadline = m.Timestamp.Add(recs[seq].deadlineIn)
				}
				out = append(out, r)
				b, _ := json.Marshal(r)
				w.Write(append(b, '\n'))
			}
			if len(again) > 0 {
				logf("producer: %d of %d records not acknowledged (%v); sending them again", len(again), len(msgs), err)
				if err := sleep(ctx, 500*time.Millisecond); err != nil {
					return out, err
				}
				if err := connect(); err != nil {
					return out, err
				}
			}
			msgs = again
		}
	}
	return out, w.Flush()
}

// seqOfMsg reads the chaos-seq header of a message being sent.
func seqOfMsg(m *sarama.ProducerMessage) int64 {
	for _, h := range m.Headers {
		if string(h.Key) == "chaos-seq" {
			n, _ := strconv.ParseInt(string(h.Value), 10, 64)
			return n
		}
	}
	return -1
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
