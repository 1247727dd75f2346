package outbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/sealtest"
	"github.com/idemhq/idem/outbox"
)

// secretMsg is a message whose value and header hold text that must not
// be found at rest.
func (e *env) secretMsg(key string) outbox.Message {
	return outbox.Message{Topic: e.topic, Key: []byte(key), Value: []byte("card 4111111111111111 of " + key),
		Headers: []handler.Header{{Key: "x-secret", Value: []byte("hdr-secret-" + key)}}}
}

// TestSealedOutbox (issue 29, item 16): with a key, Relay.Enqueue seals
// each row's value and headers at rest (read back with SQL: no plaintext,
// value and header columns empty, a key id), and the relay publishes the
// record as enqueued (real PostgreSQL and Kafka). A row whose data key is
// destroyed before it is published is never published: it moves to the
// failed state with the reason as its last_error.
func TestSealedOutbox(t *testing.T) {
	t.Parallel()
	t.Run("sealed at rest, published in clear", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, 1)
		r, reg := e.relay(e.pool)
		r.EncryptionKey = sealtest.KEK(t)
		e.enqueueBy(r.Enqueue, e.secretMsg("k1"), e.secretMsg("k2"))
		e.checkSealedAtRest(2)

		published := e.consume(e.topic)
		start(t, r)
		published.waitKeys(t, "k1", "k2")
		for _, m := range published.snapshot() {
			k := string(m.Key)
			if string(m.Value) != "card 4111111111111111 of "+k || header(m, "x-secret") != "hdr-secret-"+k || header(m, "idem-outbox-id") == "" {
				t.Errorf("published %s: value %q, x-secret %q, outbox id %q: want the message as enqueued", k, m.Value, header(m, "x-secret"), header(m, "idem-outbox-id"))
			}
		}
		waitMetric(t, reg, 2, "idem_outbox_published_total", e.tableName())
	})

	t.Run("key destroyed: failed, never published", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, 1)
		r, reg := e.relay(e.pool)
		r.EncryptionKey = sealtest.KEK(t)
		e.enqueueBy(r.Enqueue, e.secretMsg("gone"))
		e.checkSealedAtRest(1)
		sealtest.DestroyKeys(t, e.pool, "outbox", "")

		start(t, r)
		idemtest.Eventually(t, 60*time.Second, func() error {
			if n := e.count(`state = 'failed' AND last_error LIKE '%key destroyed%'`); n != 1 {
				return fmt.Errorf("%d rows failed with the reason", n)
			}
			return nil
		})
		waitMetric(t, reg, 1, "idem_outbox_publish_failures_total", "unreadable", e.tableName())
		if n := e.endOffset(); n != 0 {
			t.Errorf("the topic holds %d records; a row whose key was destroyed must never be published", n)
		}
	})
}

// tableName is the relay's table label: the default table.
func (e *env) tableName() string { return "idem_outbox" }

// checkSealedAtRest checks, with SQL, that the outbox holds n rows sealed
// at rest: a key id, an empty value and header arrays, and none of the
// messages' text in any column.
func (e *env) checkSealedAtRest(n int) {
	e.t.Helper()
	if got := e.count(`key_id IS NOT NULL AND sealed IS NOT NULL AND value IS NULL
		AND cardinality(header_keys) = 0 AND cardinality(header_values) = 0
		AND position('4111111111111111'::bytea IN sealed) = 0 AND position('hdr-secret'::bytea IN sealed) = 0`); got != n {
		var dump string
		_ = e.pool.QueryRow(e.t.Context(), `SELECT string_agg(row_to_json(o)::text, E'\n') FROM idem_outbox o`).Scan(&dump)
		e.t.Fatalf("%d of %d rows sealed at rest:\n%s", got, n, dump)
	}
}

// endOffset is the newest offset of the test's topic's partition 0.
func (e *env) endOffset() int64 {
	e.t.Helper()
	c, err := sarama.NewClient(e.k.Brokers, e.k.SaramaConfig())
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	n, err := c.GetOffset(e.topic, 0, sarama.OffsetNewest)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}
