package outbox_test

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/outbox"
)

// benchModes are the relay's two modes, as sub-benchmarks.
var benchModes = []struct {
	name        string
	exactlyOnce bool
	isolation   sarama.IsolationLevel
}{
	{"default", false, sarama.ReadUncommitted},
	{"exactly-once", true, sarama.ReadCommitted},
}

// BenchmarkRelayBacklog measures how fast one relay (default BatchSize,
// 500, and StatsInterval, 5s: the tests' 50 ms would refresh the gauges, a
// pass over the table, 20 times a second) empties a backlog of 50,000
// committed rows (10,000 keys, 100-byte values, 3 partitions), in each
// mode. It reports events/s; each iteration is one backlog, so run it with
// -benchtime=1x:
//
//	go test -run '^$' -bench RelayBacklog -benchtime=1x ./outbox/
func BenchmarkRelayBacklog(b *testing.B) {
	const rows = 50_000
	for _, mode := range benchModes {
		b.Run(mode.name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				e := newEnv(b, 3)
				if _, err := e.pool.Exec(b.Context(), `INSERT INTO idem_outbox (topic, key, value)
					SELECT $1, convert_to('k' || (i % 10000), 'UTF8'), convert_to(repeat('x', 100), 'UTF8')
					FROM generate_series(1, $2) i`, e.topic, rows); err != nil {
					b.Fatal(err)
				}
				r, reg := e.relay(e.pool)
				r.ExactlyOnce, r.BatchSize, r.StatsInterval = mode.exactlyOnce, 0, 0
				began := time.Now()
				b.StartTimer()
				stop := start(b, r)
				// The relay's own counter, read in process every 5 ms: polling
				// the table (idemtest.Eventually's waits grow to 200 ms) loaded
				// the database and added up to a sixth to a 2 s drain.
				deadline := time.Now().Add(10 * time.Minute)
				for metric(b, reg, "idem_outbox_published_total", "idem_outbox") < rows {
					if time.Now().After(deadline) {
						b.Fatalf("%v of %d rows published in 10 minutes", metric(b, reg, "idem_outbox_published_total", "idem_outbox"), rows)
					}
					time.Sleep(5 * time.Millisecond) // polling an in-process counter, not synchronisation
				}
				elapsed := time.Since(began)
				b.StopTimer()
				stop()
				if n := e.count("true"); n != 0 {
					b.Fatal(errPending(n))
				}
				b.ReportMetric(rows/elapsed.Seconds(), "events/s")
			}
		})
	}
}

type errPending int

func (n errPending) Error() string { return strconv.Itoa(int(n)) + " rows pending" }

// BenchmarkRelayLatency offers 1,000 events/s for 10 s (10 rows committed
// every 10 ms) and measures from just before each COMMIT to the record's
// arrival at a reader (read_committed for the exactly-once relay), in each
// mode, with the default StatsInterval. It reports p50 and p99 in ms; run it
// with -benchtime=1x.
func BenchmarkRelayLatency(b *testing.B) {
	for _, mode := range benchModes {
		b.Run(mode.name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				e := newEnv(b, 3)
				recs := e.consumeAt(e.topic, mode.isolation)
				r, _ := e.relay(e.pool)
				r.ExactlyOnce, r.BatchSize, r.PollInterval, r.StatsInterval = mode.exactlyOnce, 0, time.Second, 0
				start(b, r)
				b.StartTimer()
				sent := offer(b, e, 1000, 10*time.Second)
				idemtest.Eventually(b, time.Minute, func() error {
					if n := len(recs.snapshot()); n < len(sent) {
						return errPending(len(sent) - n)
					}
					return nil
				})
				b.StopTimer()
				lat := recs.latencies(sent)
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			}
		})
	}
}

// offer commits rate rows a second for d, 1/100 s at a time, each with a
// unique key, and returns the time just before each row's COMMIT by key.
func offer(b *testing.B, e *env, rate int, d time.Duration) map[string]time.Time {
	ctx := b.Context()
	sent := map[string]time.Time{}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	per := rate / 100
	for i, end := 0, time.Now().Add(d); time.Now().Before(end); <-tick.C {
		var msgs []outbox.Message
		var keys []string
		for range per {
			k := "e" + strconv.Itoa(i)
			i++
			keys = append(keys, k)
			msgs = append(msgs, e.msg(k, "v"))
		}
		var at time.Time
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			err := outbox.Enqueue(ctx, tx, msgs...)
			at = time.Now()
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range keys {
			sent[k] = at
		}
	}
	return sent
}

// latencies returns, for each record, its arrival time less its key's time
// in sent.
func (r *records) latencies(sent map[string]time.Time) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]time.Duration, 0, len(r.list))
	for i, m := range r.list {
		out = append(out, r.arrived[i].Sub(sent[string(m.Key)]))
	}
	return out
}
