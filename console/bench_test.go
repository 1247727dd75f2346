package console

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/failidx"
)

// BenchmarkRecordList measures the record-list API over an index of
// IDEM_BENCH_ROWS records (default 1,000,000) and reports the p95 latency
// of one page of 50, per query an operator makes, as p95-ms (goal: under
// 200 ms). It is a benchmark, not a test: go test -run '^$' -bench
// RecordList -benchtime 1x ./console/
func BenchmarkRecordList(b *testing.B) {
	pool, rows := loadRecords(b)
	st := failidx.NewStore(pool)
	// InsecureNoAuth lets the UI pages be fetched without a login; the API
	// calls still send the viewer's token. Nothing is replayed: no Kafka.
	h, err := newServer(Config{Tokens: []Token{{Name: "bench", Role: Viewer, Secret: viewerSecret}}, InsecureNoAuth: true}, st, failidx.NewActions(st, nil))
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(path string) (time.Duration, string) {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+viewerSecret)
		t0 := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := time.Since(t0)
		if resp.StatusCode != 200 {
			b.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
		return d, string(body)
	}
	next := func(body string) string {
		var v struct{ Next string }
		_ = json.Unmarshal([]byte(body), &v)
		return v.Next
	}
	mid := rows / 2
	queries := []struct{ name, path string }{
		{"newest", "/api/records?limit=50"},
		{"unresolved", "/api/records?status=unresolved&limit=50"},
		{"group", "/api/records?fingerprint=000000000005&status=unresolved&limit=50"},
		{"topic", "/api/records?topic=payments-3.billing.dlq&limit=50"},
		{"key", fmt.Sprintf("/api/records?key=pay-%d&limit=50", mid)},
		{"kind+day", "/api/records?kind=decode&since=" + time.Now().Add(-72*time.Hour).UTC().Format(time.RFC3339) + "&until=" + time.Now().Add(-48*time.Hour).UTC().Format(time.RFC3339) + "&limit=50"},
		{"error text", "/api/records?error=deadline%20exceeded&status=unresolved&limit=50"},
		{"page 20 of unresolved", ""},
	}
	const samples = 100
	b.ResetTimer()
	for range b.N {
		var all []time.Duration
		for _, q := range queries {
			var ds []time.Duration
			n := samples
			if q.path == "" {
				n = samples / 5
			}
			for range n {
				if q.path != "" {
					d, _ := get(q.path)
					ds = append(ds, d)
					continue
				}
				// Cursor paging: the time of page 20, reached page by page.
				path := "/api/records?status=unresolved&limit=50"
				var d time.Duration
				var body string
				for range 20 {
					d, body = get(path)
					path = "/api/records?status=unresolved&limit=50&cursor=" + next(body)
				}
				ds = append(ds, d)
			}
			slices.Sort(ds)
			all = append(all, ds...)
			b.Logf("%-22s p50 %6.1f ms  p95 %6.1f ms  max %6.1f ms", q.name, ms(ds[len(ds)/2]), ms(ds[len(ds)*95/100]), ms(ds[len(ds)-1]))
		}
		slices.Sort(all)
		b.ReportMetric(ms(all[len(all)*95/100]), "p95-ms")
		b.ReportMetric(ms(all[len(all)/2]), "p50-ms")
		// The overview, the group list, one record, and a text search that
		// matches nothing (it reads every unresolved row: no trigram index),
		// for the record; not in p95-ms.
		for _, q := range []struct{ name, path string }{{"overview", "/api/overview"}, {"groups (unresolved)", "/api/groups?status=unresolved"},
			{"error text, no match", "/api/records?error=no%20such%20text&status=unresolved&limit=50"}, {"record detail", fmt.Sprintf("/api/records/%d", mid)},
			{"UI record list page", "/records?status=unresolved"}, {"UI record page", fmt.Sprintf("/records/%d", mid)}} {
			var ds []time.Duration
			for range 10 {
				d, _ := get(q.path)
				ds = append(ds, d)
			}
			slices.Sort(ds)
			b.Logf("%-22s p50 %6.1f ms  max %6.1f ms", q.name, ms(ds[len(ds)/2]), ms(ds[len(ds)-1]))
		}
	}
}

// benchRows is IDEM_BENCH_ROWS, 1,000,000 by default: how many records the
// console benchmarks index.
func benchRows() int {
	if v := os.Getenv("IDEM_BENCH_ROWS"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
	}
	return 1_000_000
}

// loadRecords migrates the index in a schema of its own (dropped when the
// benchmark ends) and bulk-loads benchRows() records: 20 topics (one group
// each), 50 failure groups, 20 % unresolved, failures spread over 7 days, a
// 200-byte JSON value each. It returns the pool and the number of records.
func loadRecords(tb testing.TB) (*pgxpool.Pool, int) {
	tb.Helper()
	rows := benchRows()
	pool := idemtest.ConnectPostgres(tb).Pool
	ctx := tb.Context()
	start := time.Now()
	if _, err := pool.Exec(ctx, `
		INSERT INTO idem_dlq_records (dlq_topic, dlq_partition, dlq_offset, origin_topic, origin_partition, origin_offset,
			consumer_group, fingerprint, kind, msg_key, idempotency_key, attempts, first_failure_at, last_failure_at,
			error, error_type, value, value_size, status, status_actor, status_at)
		SELECT 'payments-' || (i % 20) || '.billing.dlq', i % 6, i / 60, 'payments-' || (i % 20), i % 6, i,
			'billing-' || (i % 20), lpad(to_hex(i % 50), 12, '0'),
			(ARRAY['permanent','retriable','decode','timeout','panic'])[1 + i % 5],
			convert_to('order-' || i, 'UTF8'), 'pay-' || i, 1 + i % 4,
			now() - make_interval(secs => (i::float8 / $1) * 604800) - interval '1 minute',
			now() - make_interval(secs => (i::float8 / $1) * 604800),
			'call ledger for payment pay-' || i || ': ' || (ARRAY['deadline exceeded','account frozen','insufficient funds','decode: invalid character','connection reset'])[1 + i % 5],
			'*errors.errorString',
			convert_to('{"id":"pay-' || i || '","amount":' || (i % 1000) || ',"currency":"EUR","card":{"number":"4111111111111111"},"note":"' || repeat('x', 120) || '"}', 'UTF8'),
			200, (ARRAY['unresolved','resolved','replayed','archived','resolved'])[1 + i % 5], 'bench', now()
		FROM generate_series(1, $1::int) AS i`, rows); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE idem_dlq_records`); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("indexed %d rows in %s", rows, time.Since(start).Round(time.Second))
	return pool, rows
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
