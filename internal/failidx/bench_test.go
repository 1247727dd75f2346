package failidx

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// benchRows is how many rows BenchmarkStoreList loads.
const benchRows = 1_000_000

// loadRows bulk-loads rows into idem_dlq_records with COPY: 20 DLQ topics of
// 5 groups, 200 fingerprints, 6 kinds, 70 % unresolved, failures spread over
// 7 days.
func loadRows(b *testing.B, ctx context.Context, db interface {
	CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error)
}, rows int) {
	b.Helper()
	kinds := []string{"retriable", "permanent", "panic", "decode", "timeout", "missing-key"}
	statuses := []string{"unresolved", "unresolved", "unresolved", "unresolved", "unresolved", "unresolved", "unresolved", "replayed", "replayed", "resolved"}
	now := time.Now()
	rng := rand.New(rand.NewPCG(1, 2))
	cols := []string{"dlq_topic", "dlq_partition", "dlq_offset", "origin_topic", "origin_partition", "origin_offset", "consumer_group",
		"fingerprint", "kind", "msg_key", "idempotency_key", "attempts", "first_failure_at", "last_failure_at", "error", "error_type",
		"value", "value_size", "headers", "status", "status_at"}
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i == rows {
			return nil, nil
		}
		t, g := i%20, i%5
		fp := rng.IntN(200)
		kind := kinds[fp%len(kinds)]
		msg := fmt.Sprintf("step %d of svc%d failed for order %d: %s", fp, t, i, kind)
		last := now.Add(-time.Duration(rng.Int64N(int64(7 * 24 * time.Hour))))
		value := fmt.Appendf(nil, `{"order":"ord-%d","amount":%d,"note":"%s"}`, i, i%997, strings.Repeat("y", 100))
		status := statuses[rng.IntN(len(statuses))]
		if rng.IntN(20) == 0 {
			status = "archived"
		}
		row := []any{fmt.Sprintf("svc%d.Group%d.dlq", t, g), int32(i % 3), int64(i / 3), fmt.Sprintf("svc%d", t), int32(i % 3), int64(i),
			fmt.Sprintf("group%d", g), fingerprint("permanent", "*errors.errorString", fmt.Sprintf("step %d of svc%d", fp, t)), kind,
			[]byte(fmt.Sprint("acct-", i%10000)), fmt.Sprint("ord-", i), 3, last.Add(-time.Minute), last, msg, "*errors.errorString",
			value, len(value), encodeHeaders([]Header{{Key: []byte("idempotency-key"), Value: fmt.Appendf(nil, "ord-%d", i)}, {Key: []byte("idem-error"), Value: []byte(msg)}}),
			status, last}
		i++
		return row, nil
	})
	if _, err := db.CopyFrom(ctx, pgx.Identifier{"idem_dlq_records"}, cols, src); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStoreList measures Store.List at 1,000,000 indexed records
// (bulk-loaded with COPY): the p50, p95 and max of 200 calls of each
// filter, first pages and pages deep in a cursor walk, as the console's
// record list asks for them (50 records a page). Groups and Overview are
// timed too.
//
//	go test -run '^$' -bench BenchmarkStoreList -benchtime 1x -timeout 30m ./internal/failidx
func BenchmarkStoreList(b *testing.B) {
	pool, _ := failidxtest.NewPool(b)
	ctx := testenv.Context(b)
	start := time.Now()
	loadRows(b, ctx, pool, benchRows)
	if _, err := pool.Exec(ctx, `ANALYZE idem_dlq_records`); err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded %d rows with COPY in %v", benchRows, time.Since(start).Round(time.Second))
	s := NewStore(pool)
	fp := fingerprint("permanent", "*errors.errorString", "step 7 of svc7")
	week := time.Now().Add(-7 * 24 * time.Hour)
	cases := []struct {
		name  string
		f     Filter
		pages int // cursor pages walked per call (the last one timed)
	}{
		{"all, first page", Filter{}, 1},
		{"unresolved", Filter{Status: []Status{Unresolved}}, 1},
		{"unresolved, page 20", Filter{Status: []Status{Unresolved}}, 20},
		{"topic + unresolved", Filter{Topic: "svc3.group3.dlq", Status: []Status{Unresolved}}, 1},
		{"group + unresolved", Filter{Group: "group2", Status: []Status{Unresolved}}, 1},
		{"failure group (fingerprint) + unresolved", Filter{Fingerprint: fp, Status: []Status{Unresolved}}, 1},
		{"kind", Filter{Kind: "decode"}, 1},
		{"key", Filter{Key: "ord-424242"}, 1},
		{"error text (frequent)", Filter{ErrorContains: "svc4 failed"}, 1},
		{"time range (one hour, 4 days ago)", Filter{Since: week.Add(72 * time.Hour), Until: week.Add(73 * time.Hour)}, 1},
		{"topic + kind + unresolved + 1 day", Filter{Topic: "svc5.group0.dlq", Kind: "timeout", Status: []Status{Unresolved}, Since: time.Now().Add(-24 * time.Hour)}, 1},
	}
	b.ResetTimer()
	for range b.N {
		var worst time.Duration
		var report []string
		for _, c := range cases {
			var ds []time.Duration
			for range 200 {
				cursor := ""
				var d time.Duration
				for range c.pages {
					t0 := time.Now()
					p, err := s.List(ctx, c.f, cursor, 50)
					d = time.Since(t0)
					if err != nil {
						b.Fatalf("%s: %v", c.name, err)
					}
					cursor = p.Next
				}
				ds = append(ds, d)
			}
			p50, p95, mx := percentiles(ds)
			worst = max(worst, p95)
			report = append(report, fmt.Sprintf("%-45s p50 %7.2f ms  p95 %7.2f ms  max %7.2f ms", c.name, ms(p50), ms(p95), ms(mx)))
		}
		for _, c := range []struct {
			name string
			f    func() error
		}{
			{"Groups (all)", func() error { _, err := s.Groups(ctx, Filter{}); return err }},
			{"Groups (one topic, unresolved)", func() error {
				_, err := s.Groups(ctx, Filter{Topic: "svc3.group3.dlq", Status: []Status{Unresolved}})
				return err
			}},
			{"Overview", func() error { _, err := s.Overview(ctx); return err }},
		} {
			var ds []time.Duration
			for range 10 {
				t0 := time.Now()
				if err := c.f(); err != nil {
					b.Fatalf("%s: %v", c.name, err)
				}
				ds = append(ds, time.Since(t0))
			}
			p50, p95, mx := percentiles(ds)
			report = append(report, fmt.Sprintf("%-45s p50 %7.2f ms  p95 %7.2f ms  max %7.2f ms (10 calls)", c.name, ms(p50), ms(p95), ms(mx)))
		}
		b.ReportMetric(ms(worst), "worst-p95-ms")
		b.Logf("Store.List at %d rows, 50 per page, 200 calls each:\n%s", benchRows, strings.Join(report, "\n"))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// percentiles returns the p50, p95 and max of ds.
func percentiles(ds []time.Duration) (p50, p95, mx time.Duration) {
	slices.Sort(ds)
	at := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	return at(0.5), at(0.95), ds[len(ds)-1]
}
