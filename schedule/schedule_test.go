package schedule_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
	"github.com/idemhq/idem/schedule"
)

// idem.Migrate may call Migrate with its dedupe.DB.
var _ schedule.Beginner = dedupe.DB(nil)

// TestDeferRefusesBadInput (issue 21, test 7): each bad record gets a clear
// error wrapping ErrInvalidRecord, and nothing is inserted.
func TestDeferRefusesBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := t.Context()
	tests := []struct {
		name   string
		mutate func(r *schedule.Record, at *time.Time)
		noTx   bool
		want   string
	}{
		{name: "nil transaction", noTx: true, want: "nil transaction"},
		{name: "no group", mutate: func(r *schedule.Record, _ *time.Time) { r.Group = "" }, want: "no Group"},
		{name: "no topic", mutate: func(r *schedule.Record, _ *time.Time) { r.Topic = "" }, want: "no Topic"},
		{name: "empty header name", mutate: func(r *schedule.Record, _ *time.Time) {
			r.Headers = append(r.Headers, sarama.RecordHeader{Key: nil, Value: []byte("x")})
		}, want: "has an empty name"},
		{name: "NUL in idempotency key", mutate: func(r *schedule.Record, _ *time.Time) { r.IdempotencyKey = "k\x00" },
			want: "IdempotencyKey"},
		{name: "NUL in header name", mutate: func(r *schedule.Record, _ *time.Time) {
			r.Headers = append(r.Headers, sarama.RecordHeader{Key: []byte("a\x00b")})
		}, want: `name "a\x00b" is not valid UTF-8`},
		{name: "topic not UTF-8", mutate: func(r *schedule.Record, _ *time.Time) { r.Topic = "\xff" }, want: "Topic"},
		{name: "origin topic not UTF-8", mutate: func(r *schedule.Record, _ *time.Time) { r.Origin.Topic = "\xff" }, want: "Origin.Topic"},
		{name: "too far", mutate: func(_ *schedule.Record, at *time.Time) {
			*at = time.Now().Add(handler.MaxDefer + 48*time.Hour)
		}, want: "more than"},
		{name: "year 294277", mutate: func(_ *schedule.Record, at *time.Time) {
			*at = time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC)
		}, want: "more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, at := e.record(1), time.Now().Add(time.Hour)
			if tt.mutate != nil {
				tt.mutate(&rec, &at)
			}
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if tt.noTx {
				err = schedule.Defer(ctx, nil, rec, at, nil)
			} else {
				err = schedule.Defer(ctx, tx, rec, at, nil)
			}
			if !errors.Is(err, schedule.ErrInvalidRecord) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Defer: %v; want ErrInvalidRecord saying %q", err, tt.want)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if n := e.pending(); n != 0 {
				t.Fatalf("%d rows inserted", n)
			}
		})
	}
}

// TestSchedulerValidate (issue 21, test 7): a bad configuration is an error
// from Validate and Run, naming the field, never a panic or a stall.
func TestSchedulerValidate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	tests := []struct {
		name   string
		mutate func(s *schedule.Scheduler)
		want   string
	}{
		{"no pool", func(s *schedule.Scheduler) { s.Pool = nil }, "Scheduler.Pool"},
		{"no brokers", func(s *schedule.Scheduler) { s.Brokers = nil }, "Scheduler.Brokers"},
		{"no group", func(s *schedule.Scheduler) { s.Group = "" }, "Scheduler.Group"},
		{"negative batch", func(s *schedule.Scheduler) { s.BatchSize = -1 }, "Scheduler.BatchSize = -1"},
		{"negative wait", func(s *schedule.Scheduler) { s.MaxWait = -time.Second }, "Scheduler.MaxWait = -1s"},
		{"negative timeout", func(s *schedule.Scheduler) { s.QueryTimeout = -1 }, "Scheduler.QueryTimeout"},
		{"base above max", func(s *schedule.Scheduler) { s.RetryBase, s.RetryMax = time.Minute, time.Second }, "Scheduler.RetryBase"},
		{"bad sarama", func(s *schedule.Scheduler) { s.Sarama.Net.DialTimeout = -1 }, "Scheduler.Sarama"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := e.scheduler()
			tt.mutate(s)
			for _, err := range []error{s.Validate(), s.Run(context.Background())} {
				if !errors.Is(err, schedule.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("got %v; want ErrInvalidConfig naming %q", err, tt.want)
				}
			}
		})
	}
	var nilScheduler *schedule.Scheduler
	if err := nilScheduler.Run(context.Background()); !errors.Is(err, schedule.ErrInvalidConfig) {
		t.Fatalf("nil Scheduler: %v", err)
	}
	s, _ := e.scheduler()
	if err := s.Validate(); err != nil {
		t.Fatalf("the test's scheduler is invalid: %v", err)
	}
}

// TestListShowsPendingInDueOrder: List returns a group's rows in due order,
// with what an operator needs.
func TestListShowsPendingInDueOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	now := time.Now()
	e.deferAll(now.Add(2*time.Hour), e.record(2))
	e.deferAll(now.Add(time.Hour), e.record(1))
	other := *e
	other.group = "another-group"
	e.deferAll(now.Add(time.Minute), other.record(3))

	ctx := t.Context()
	ps, err := schedule.List(ctx, e.pool, schedule.Filter{Group: e.group})
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || string(ps[0].Key) != "k001" || string(ps[1].Key) != "k002" {
		t.Fatalf("List = %+v, want k001 then k002", ps)
	}
	p := ps[0]
	if p.Group != e.group || p.Topic != e.topic || p.IdempotencyKey != "idem-k001" || p.Origin.Topic != "payments" ||
		p.Origin.Offset != 1 || !p.DueAt.Equal(p.DeferredUntil) || p.DueAt.Sub(now.Add(time.Hour)).Abs() > time.Millisecond {
		t.Fatalf("row %+v", p)
	}
	all, err := schedule.List(ctx, e.pool, schedule.Filter{Limit: 1})
	if err != nil || len(all) != 1 || string(all[0].Key) != "k003" {
		t.Fatalf("List(all, limit 1) = %+v, %v", all, err)
	}
}

// TestRecordOfKeepsTheMessageAndItsOrigin: the record of a message read from
// a retry tier keeps its key, value and own headers, names its first
// origin, and drops the tier's due time, tier and error.
func TestRecordOfKeepsTheMessageAndItsOrigin(t *testing.T) {
	first := time.UnixMilli(1_700_000_000_000)
	tierHeaders := wire.Encode([]handler.Header{
		{Key: "idempotency-key", Value: []byte("pay-1")}, {Key: "trace-id", Value: []byte("abc")},
	}, retrytopic.Failure{Attempt: 4, Tier: 2, DueAt: first.Add(time.Hour), OriginalTopic: "payments", OriginalPartition: 2,
		OriginalOffset: 41, OriginalTimestamp: first, Group: "billing", Error: "bank down", Kind: handler.KindRetriable})
	m := &handler.Message{Topic: "payments.billing.retry.2", Partition: 0, Offset: 7, Key: []byte("order-1"), Value: []byte("{}"),
		IdempotencyKey: "pay-1", Attempt: 5,
		Original: handler.Origin{Topic: "payments", Partition: 2, Offset: 41, Timestamp: first}}
	for _, h := range tierHeaders {
		m.Headers = append(m.Headers, handler.Header{Key: string(h.Key), Value: h.Value})
	}
	rec := schedule.RecordOf("billing", "payments.billing.deferred", m)
	if rec.Group != "billing" || rec.Topic != "payments.billing.deferred" || rec.Partition != 2 || string(rec.Key) != "order-1" ||
		string(rec.Value) != "{}" || rec.IdempotencyKey != "pay-1" || rec.Origin != m.Original {
		t.Fatalf("RecordOf = %+v", rec)
	}
	f, ok, err := wire.Decode(rec.Headers)
	if !ok || err != nil {
		t.Fatalf("Decode: %v %v", ok, err)
	}
	want := retrytopic.Failure{Attempt: 5, OriginalTopic: "payments", OriginalPartition: 2, OriginalOffset: 41,
		OriginalTimestamp: first, Group: "billing", IdempotencyKey: "pay-1"}
	if f.Attempt != want.Attempt || f.OriginalTopic != want.OriginalTopic || f.OriginalPartition != want.OriginalPartition ||
		f.OriginalOffset != want.OriginalOffset || !f.OriginalTimestamp.Equal(first) || f.Group != want.Group ||
		f.IdempotencyKey != want.IdempotencyKey || f.Tier != 0 || !f.DueAt.IsZero() || f.Error != "" || f.Kind != "" {
		t.Fatalf("decoded %+v, want %+v", f, want)
	}
	own := wire.StripHeaders(rec.Headers)
	if len(own) != 2 || string(own[0].Key) != "idempotency-key" || string(own[0].Value) != "pay-1" || string(own[1].Key) != "trace-id" {
		t.Fatalf("own headers %v", own)
	}
}
