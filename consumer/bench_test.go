package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// BenchmarkRetryDueLatency measures how long after its idem-due-at a retry
// record reaches the handler (goal: within 1 s under normal load). Each
// iteration is one message that fails once at the source and succeeds in
// tier 1 (delay 1 s); the reported figures are over all messages:
// due-p50-ms, due-p99-ms, due-max-ms.
//
//	make bench BENCHFLAGS='-run ^$ -bench RetryDueLatency -benchtime 2000x'
func BenchmarkRetryDueLatency(b *testing.B) {
	k := testenv.NewKafka(b)
	pool := testenv.Postgres(b)
	ctx := testenv.Context(b)
	if err := dedupe.NewPostgres(pool).Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	topic := k.Topic(b, 6)
	group := testenv.Unique("g_bench")
	b.Cleanup(func() {
		k.DeleteTopics(b, retrytopic.Policy{}.Tier(topic, group, 1), retrytopic.Policy{}.DLQ(topic, group))
	})
	var mu sync.Mutex
	lat := make([]time.Duration, 0, b.N)
	done := make(chan struct{})
	var once sync.Once
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		due, _ := m.Header(wire.HeaderDueAt)
		ms, _ := strconv.ParseInt(string(due), 10, 64)
		mu.Lock()
		lat = append(lat, time.Since(time.UnixMilli(ms)))
		if len(lat) == b.N {
			once.Do(func() { close(done) })
		}
		mu.Unlock()
		return nil
	})
	cfg := consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{topic},
		Dedupe: dedupe.NewPostgres(pool), Sarama: k.SaramaConfig(),
		Logger:     slog.New(slog.DiscardHandler),
		Registerer: prometheus.NewRegistry(),
		Retry:      consumer.RetryConfig{Attempts: 1, Tiers: retrytopic.Policy{Delays: []time.Duration{time.Second}}},
	}
	p := k.Producer(b)
	b.ResetTimer()
	msgs := make([]*sarama.ProducerMessage, 0, b.N)
	for i := range b.N {
		msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: int32(i % 6), Value: sarama.StringEncoder("x"),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(fmt.Sprint("k", i))}}})
	}
	if err := p.SendMessages(msgs); err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- consumer.Run(rctx, cfg, h) }()
	select {
	case <-done:
	case err := <-errc:
		b.Fatal(err)
	case <-time.After(10 * time.Minute):
		b.Fatal("timed out")
	}
	b.StopTimer()
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(q(0.5), "due-p50-ms")
	b.ReportMetric(q(0.99), "due-p99-ms")
	b.ReportMetric(q(1), "due-max-ms")
}
