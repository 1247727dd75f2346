package index

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// BenchmarkIndexer measures how many dead letters per second the indexer
// stores: 50,000 records (3 partitions, ~250-byte values, the consumer's
// headers) produced first, then indexed from the start by a new group,
// with the payloads in clear and sealed (EncryptionKey). It reports
// records/s and µs/record (wall time per record, group join included).
//
//	go test -run '^$' -bench BenchmarkIndexer -benchtime 1x ./console/index
func BenchmarkIndexer(b *testing.B) {
	const n = 50_000
	k := testenv.NewKafka(b)
	pool, _ := testenv.PostgresSchema(b)
	ctx := testenv.Context(b)
	if err := tables.MigrateIndex(ctx, pool); err != nil {
		b.Fatal(err)
	}
	topic := k.Topic(b, 3)
	p := k.Producer(b)
	now := time.Now()
	for start := 0; start < n; start += 1000 {
		msgs := make([]*sarama.ProducerMessage, 0, 1000)
		for i := start; i < start+1000; i++ {
			f := retrytopic.Failure{Attempt: 3, OriginalTopic: "payments", OriginalPartition: int32(i % 3), OriginalOffset: int64(i),
				Group: "billing", Kind: "permanent", ErrorType: "*errors.errorString", Error: fmt.Sprintf("ledger refused payment pay-%d: limit exceeded", i),
				FirstFailureAt: now, LastFailureAt: now}
			hs := wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(fmt.Sprint("pay-", i))}}, f)
			msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: int32(i % 3), Key: sarama.StringEncoder(fmt.Sprint("acct-", i%1000)),
				Value:   sarama.StringEncoder(fmt.Sprintf(`{"payment_id":"pay-%d","account":"acct-%d","amount":%d,"currency":"EUR","note":"%s"}`, i, i%1000, i, strings.Repeat("x", 150))),
				Headers: hs})
		}
		if err := p.SendMessages(msgs); err != nil {
			b.Fatal(err)
		}
	}
	kek, _, err := seal.GenerateKEK()
	if err != nil {
		b.Fatal(err)
	}
	if err := seal.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []struct{ name, kek string }{{"clear", ""}, {"sealed", kek}} {
		b.Run(mode.name, func(b *testing.B) { benchIndex(b, k, pool, topic, n, mode.kek) })
	}
}

// benchIndex indexes the n records of topic afresh b.N times, sealed under
// kek when it is not "".
func benchIndex(b *testing.B, k *testenv.Kafka, pool *pgxpool.Pool, topic string, n int, kek string) {
	ctx := testenv.Context(b)
	for range b.N {
		if _, err := pool.Exec(ctx, `TRUNCATE idem_dlq_records, idem_dlq_groups CASCADE`); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		stop := runUntil(b, &Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Group: testenv.Group(b), Topics: []string{topic}, Retention: -1,
			EncryptionKey: kek})
		for {
			var got int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_dlq_records`).Scan(&got); err != nil {
				b.Fatal(err)
			}
			if got == n {
				break
			}
			if time.Since(start) > 5*time.Minute {
				b.Fatalf("%d of %d indexed after 5 m", got, n)
			}
			time.Sleep(50 * time.Millisecond) // polling the benchmark's end, not synchronisation
		}
		elapsed := time.Since(start)
		stop()
		var clear int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_dlq_records WHERE key_id IS NULL`).Scan(&clear); err != nil || (kek != "") != (clear == 0) {
			b.Fatalf("%d of %d rows in clear with key %v (%v)", clear, n, kek != "", err)
		}
		b.ReportMetric(float64(n)/elapsed.Seconds(), "records/s")
		b.ReportMetric(float64(elapsed.Microseconds())/float64(n), "µs/record")
		b.Logf("indexed %d records in %v: %.0f records/s, %.1f µs a record (including the group join)", n, elapsed.Round(time.Millisecond),
			float64(n)/elapsed.Seconds(), float64(elapsed.Microseconds())/float64(n))
	}
}
