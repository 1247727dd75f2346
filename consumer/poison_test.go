package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
)

// TestPoisonMessages: on one partition, in order: a record without the
// idempotency-key header, one whose handler panics, one with a 257-byte key,
// one with a 256-byte key, a tombstone, an ordinary record. The invalid-key
// and panic records go to <topic>.<group>.dlq with the right idem-error-kind;
// the others are processed; every offset is committed.
func TestPoisonMessages(t *testing.T) {
	t.Parallel()
	forEachMode(t, allModes, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1).in(mode)
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
				check(wire.HeaderErrorKind, string(w.kind))
				check(wire.HeaderOriginalTopic, e.topic)
				check(wire.HeaderOriginalPartition, "0")
				check(wire.HeaderOriginalOffset, strconv.FormatInt(w.offset, 10))
				check(wire.HeaderConsumerGroup, e.group)
				if _, ok := coreHeader(r, "trace"); !ok {
					t.Errorf("original header %q was not kept", "trace")
				}
				stack, hasStack := coreHeader(r, wire.HeaderStack)
				if w.kind == handler.KindPanic {
					if !hasStack || stack == "" {
						t.Errorf("panic record has no %s", wire.HeaderStack)
					} else if len(stack) > wire.MaxStackBytes {
						t.Errorf("%s is %d bytes, above the %d cap", wire.HeaderStack, len(stack), wire.MaxStackBytes)
					}
					if msg, _ := coreHeader(r, wire.HeaderError); !strings.Contains(msg, "boom: poison payload") {
						t.Errorf("%s = %q, want the panic value", wire.HeaderError, msg)
					}
				} else if hasStack {
					t.Errorf("%s present on a %s record", wire.HeaderStack, w.kind)
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
		if got := gatherSum(t, e.reg, "idem_messages_total", map[string]string{"outcome": coremetrics.OutcomeDeadLettered}); got != 3 {
			t.Errorf("idem_messages_total{outcome=dead_lettered} = %v, want 3", got)
		}
	})
}

// hardRecord is one record of the hardening tests: a JSON value whose "op"
// tells hardHandler what to do, an optional idempotency-key header, and an
// optional "id" JSON field used as the key when the header is absent.
type hardRecord struct {
	header []byte // idempotency-key header value; nil: no header
	id     string // JSON "id"
	op     string // "ok", "bad-int" (SQLSTATE 22P02), "deferred" (fails at COMMIT), "kill" (terminates its backend), "reject" (permanent)
	pad    int    // bytes of padding in the value
}

func (e *env) produceHard(recs []hardRecord) {
	e.t.Helper()
	p := e.bigProducer()
	for _, r := range recs {
		v, _ := json.Marshal(map[string]string{"id": r.id, "op": r.op, "pad": strings.Repeat("x", r.pad)})
		m := &sarama.ProducerMessage{Topic: e.topic, Partition: 0, Key: sarama.StringEncoder("k"), Value: sarama.ByteEncoder(v)}
		if r.header != nil {
			m.Headers = []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: r.header}}
		}
		if _, _, err := p.SendMessage(m); err != nil {
			e.t.Fatalf("produce: %v", err)
		}
	}
}

// hardKey reads the idempotency-key header, or else the JSON "id" field, byte
// for byte (a NUL in the JSON string stays a NUL).
func hardKey(m *handler.Message) (string, error) {
	if v, ok := m.Header("idempotency-key"); ok {
		return string(v), nil
	}
	var v struct{ ID string }
	if err := json.Unmarshal(m.Value, &v); err != nil {
		return "", err
	}
	return v.ID, nil
}

// hardHandler applies "ok" records as one effects row and misbehaves as the
// record's op says.
func hardHandler(kill func() bool) handler.Func {
	return func(ctx context.Context, m *handler.Message) error {
		var v struct{ Op string }
		if err := json.Unmarshal(m.Value, &v); err != nil {
			return handler.Decode(err)
		}
		tx := dedupe.Tx(ctx)
		switch v.Op {
		case "bad-int":
			_, err := tx.Exec(ctx, `SELECT 'not a number'::int`)
			return err
		case "deferred":
			// Violates a deferred constraint: every statement succeeds, COMMIT fails (23505).
			if _, err := tx.Exec(ctx, `INSERT INTO deferred_uniq(v) VALUES (1), (1)`); err != nil {
				return err
			}
		case "reject":
			return handler.Permanent(errors.New("rejected"))
		case "kill":
			if kill() {
				// The database goes away under the handler (57P01 admin_shutdown).
				_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects(key, topic, part, off) VALUES ($1,$2,$3,$4)`, m.IdempotencyKey, m.Topic, m.Partition, m.Offset)
		return err
	}
}

// TestBadRecordsNeverStallAPartition: one partition, in order, a good record,
// then records each of which used to stop the partition or burn its retries
// on the wrong thing, then a good record. The last good record is applied,
// every bad one is in the DLQ with its kind, nothing is applied twice.
func TestBadRecordsNeverStallAPartition(t *testing.T) {
	forEachMode(t, allModes, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1).in(mode)
		ctx := testenv.Context(t)
		if _, err := e.pool.Exec(ctx, `CREATE TABLE deferred_uniq(v int, CONSTRAINT u UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
			t.Fatal(err)
		}
		fourMiB := strconv.Itoa(4 << 20)
		if err := e.k.Admin(t).AlterConfig(sarama.TopicResource, e.topic, map[string]*string{"max.message.bytes": &fourMiB}, false); err != nil {
			t.Fatal(err)
		}
		e.produceHard([]hardRecord{
			{header: []byte("good-1"), op: "ok"},
			{header: []byte("bad-\xff\xfe-utf8"), op: "ok"},
			{id: "nul\x00inside", op: "ok"},
			{header: []byte("sqlstate-22P02"), op: "bad-int"},
			{header: []byte("deferred-23505"), op: "deferred"},
			{header: []byte("big-1.5MB"), op: "reject", pad: 1536 << 10},
			{header: []byte("good-2"), op: "ok"},
		})
		cfg := e.config()
		cfg.KeyFunc = hardKey
		start(t, cfg, hardHandler(func() bool { return false }))

		dlq := e.topic + "." + e.group + ".dlq"
		recs := e.coreReadRecords(dlq, 0, 5, 60*time.Second)
		sortByOrigin(recs) // lanes may dead-letter them in another order
		want := []struct{ offset, kind string }{{"1", "invalid-key"}, {"2", "invalid-key"}, {"3", "permanent"}, {"4", "retriable"}, {"5", "permanent"}}
		for i, w := range want {
			off, _ := coreHeader(recs[i], "idem-original-offset")
			kind, _ := coreHeader(recs[i], "idem-error-kind")
			if off != w.offset || kind != w.kind {
				msg, _ := coreHeader(recs[i], "idem-error")
				t.Errorf("DLQ record %d: offset %s kind %s (%s); want offset %s kind %s", i, off, kind, msg, w.offset, w.kind)
			}
		}
		if msg, _ := coreHeader(recs[3], "idem-error"); !strings.Contains(msg, "23505") {
			t.Errorf("deferred-constraint record's error %q does not name SQLSTATE 23505", msg)
		}
		if n := len(recs[4].Value); n < 1536<<10 {
			t.Errorf("the 1.5 MB record reached the DLQ with %d bytes of value, want it whole", n)
		}
		e.waitCommitted(e.topic, 1, 30*time.Second)
		if n := e.count(`SELECT count(*) FROM effects`); n != 2 {
			t.Errorf("effects: %d rows, want 2 (good-1, good-2)", n)
		}
		if n := e.count(`SELECT count(DISTINCT key) FROM effects WHERE key IN ('good-1','good-2')`); n != 2 {
			t.Errorf("good records applied: %d of 2", n)
		}
		// A database data error is not an outage: no store errors were counted.
		if n := metricValue(t, e, "idem_store_errors_total", nil); n != 0 {
			t.Errorf("idem_store_errors_total = %v, want 0 (no outage happened)", n)
		}
	})
}

// TestHandlerThatAlwaysKillsItsConnectionEndsInDLQ: a record whose handling
// terminates the database connection every time, while the store itself
// works, is the record's fault: after a few outage tries it takes the
// handler-failure path (retries, then the DLQ) and the partition moves on.
func TestHandlerThatAlwaysKillsItsConnectionEndsInDLQ(t *testing.T) {
	e := newEnv(t, 1)
	e.produceHard([]hardRecord{{header: []byte("poison"), op: "kill"}, {header: []byte("after"), op: "ok"}})
	cfg := e.config()
	cfg.OutageBackoff = 50 * time.Millisecond
	start(t, cfg, hardHandler(func() bool { return true }))
	recs := e.coreReadRecords(e.topic+"."+e.group+".dlq", 0, 1, 60*time.Second)
	if key, _ := coreHeader(recs[0], "idempotency-key"); key != "poison" {
		t.Errorf("DLQ record key %q, want poison", key)
	}
	e.waitCommitted(e.topic, 1, 30*time.Second)
	if n := e.count(`SELECT count(*) FROM effects WHERE key = 'after'`); n != 1 {
		t.Errorf("the next record applied %d times, want 1", n)
	}
}
