package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// Issue 20: a forward the broker refuses for good aborts the member's Kafka
// transaction (a refused produce leaves sarama's transactional producer
// abortable), so the record cannot fall back to its next form in the same
// transaction as it does without Transactions. The member remembers the
// refusal: its next try of the offset starts at the form after the refused
// one, so the record ends in the dead-letter topic once, for a read_committed
// reader, and the partition moves on; never an endless retry of one offset.
func TestTxnRefusedRecordEndsAsStub(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// setup pre-creates the refusing topic and returns the records and
		// the handler's error for "refused".
		setup func(e *env) ([]sizeRecord, error)
		check func(t *testing.T, e *env, f retrytopic.Failure, m *sarama.ConsumerMessage)
	}{
		{
			name: "DLQ too small: a stub",
			setup: func(e *env) ([]sizeRecord, error) {
				e.setTopicConfig(e.topic, "max.message.bytes", strconv.Itoa(fourMiB))
				e.preCreate(e.dlq(), map[string]string{"max.message.bytes": strconv.Itoa(oneMiB)})
				return []sizeRecord{{key: "refused", kafkaKey: []byte("k"), value: big(bigBytes)}, {key: "after", kafkaKey: []byte("k"), value: []byte(`{}`)}},
					handler.Permanent(errors.New("cannot apply"))
			},
			check: func(t *testing.T, e *env, f retrytopic.Failure, m *sarama.ConsumerMessage) {
				if m.Value != nil || !f.Stub || f.OmittedBytes != bigBytes || f.Kind != handler.KindPermanent {
					t.Errorf("DLQ record: %d value bytes, headers %+v; want a stub omitting %d bytes", len(m.Value), f, bigBytes)
				}
				if !strings.Contains(f.ForwardError, sarama.ErrMessageSizeTooLarge.Error()) {
					t.Errorf("%s = %q, want the broker's MESSAGE_TOO_LARGE", wire.HeaderForwardError, f.ForwardError)
				}
			},
		},
		{
			name: "tier refuses: the DLQ whole",
			setup: func(e *env) ([]sizeRecord, error) {
				e.preCreate(e.tier(1), map[string]string{"cleanup.policy": "compact"}) // refuses a keyless record
				return []sizeRecord{{key: "refused", value: []byte(`{"n":1}`)}, {key: "after", value: []byte(`{}`)}},
					errors.New("try later")
			},
			check: func(t *testing.T, e *env, f retrytopic.Failure, m *sarama.ConsumerMessage) {
				if string(m.Value) != `{"n":1}` || f.Stub || f.Kind != handler.KindRetriable || f.Tier != 0 {
					t.Errorf("DLQ record %q, headers %+v; want the whole record", m.Value, f)
				}
				if !strings.Contains(f.ForwardError, sarama.ErrInvalidRecord.Error()) {
					t.Errorf("%s = %q, want the broker's INVALID_RECORD", wire.HeaderForwardError, f.ForwardError)
				}
				if recs := e.records(e.tier(1), sarama.ReadCommitted); len(recs) != 0 {
					t.Errorf("tier 1 has %d records for a read_committed reader, want 0", len(recs))
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			recs, cause := tc.setup(e)
			cfg := txnConfig(e.config(), "")
			var logs logBuffer
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("%d aborted transactions logged", strings.Count(logs.String(), "Kafka transaction failed and aborted"))
				}
			})
			e.produceLarge(recs...)
			r := start(t, cfg, failKeys(map[string]error{"refused": cause}))
			e.waitEffect("after", 60*time.Second)
			e.waitCommitted(e.topic, 1, 30*time.Second)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			t.Logf("the member's log:\n%s", logs.String())
			dl := e.records(e.dlq(), sarama.ReadCommitted)
			if len(dl) != 1 {
				t.Fatalf("the DLQ has %d records for a read_committed reader, want 1", len(dl))
			}
			f, _, err := wire.Decode(dl[0].Headers)
			if err != nil || f.OriginalTopic != e.topic || f.OriginalOffset != 0 || header(dl[0], "idempotency-key") != "refused" {
				t.Fatalf("DLQ headers = %+v, %v", f, err)
			}
			tc.check(t, e, f, dl[0])
			if n := strings.Count(logs.String(), "Kafka transaction failed and aborted"); n != 1 {
				t.Errorf("%d aborted transactions logged, want 1", n)
			}
		})
	}
}

// Issue 20: with Transactions, a dead-letter topic that refuses every form
// of a record (compacted, and the record has no Kafka key) makes the
// partition wait as it does without Transactions: the offset is not
// committed, nothing is lost, and the record's rounds are spaced by the
// outage backoff rather than aborting transactions back to back. Once the
// topic accepts the record, it lands whole, once for a read_committed
// reader.
func TestTxnDLQRefusingEveryFormWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.preCreate(e.dlq(), map[string]string{"cleanup.policy": "compact"})
	cfg := txnConfig(e.config(), "")
	cfg.OutageBackoff = 300 * time.Millisecond
	var logs logBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.produceLarge(sizeRecord{key: "keyless", value: []byte(`{"n":1}`)}, sizeRecord{key: "after", value: []byte(`{}`)})
	h := failKeys(map[string]error{"keyless": handler.Permanent(errors.New("no"))})
	run := start(t, cfg, h)
	testenv.Eventually(t, 60*time.Second, func() error {
		// Round 1 aborts at the whole record, the stub and the bare stub;
		// round 2 starts again after a wait.
		if !strings.Contains(logs.String(), "the dead-letter topic refuses even a stub of this record") {
			return errors.New("no round has found every form refused yet")
		}
		return nil
	})
	if err := run.stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("the member's log:\n%s", logs.String())
	if got := e.committed(e.topic, 1)[0]; got > 0 {
		t.Fatalf("committed offset %d while the DLQ refuses the record, want none", got)
	}
	if n := e.count(`SELECT count(*) FROM effects`); n != 0 && cfg.Concurrency == 1 {
		t.Fatalf("%d effects while the partition waits, want 0", n) // with lanes "after" may run in another lane; its offset waits
	}
	if recs := e.records(e.dlq(), sarama.ReadCommitted); len(recs) != 0 {
		t.Fatalf("the DLQ has %d records for a read_committed reader while it refuses them, want 0", len(recs))
	}
	e.uncompactDLQ()
	start(t, cfg, h)
	e.waitEffect("after", 60*time.Second)
	e.waitCommitted(e.topic, 1, 30*time.Second)
	var got []*sarama.ConsumerMessage
	for _, m := range e.records(e.dlq(), sarama.ReadCommitted) {
		if header(m, "test-probe") == "" {
			got = append(got, m)
		}
	}
	if len(got) != 1 || string(got[0].Value) != `{"n":1}` || header(got[0], wire.HeaderPayloadOmitted) != "" {
		for _, m := range e.records(e.dlq(), sarama.ReadUncommitted) {
			t.Logf("uncommitted: offset %d key %q value %q headers %d", m.Offset, m.Key, m.Value, len(m.Headers))
		}
		t.Fatalf("the DLQ holds %d copies of the record for a read_committed reader, want it once and whole; the member's log:\n%s", len(got), logs.String())
	}
}
