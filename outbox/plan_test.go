package outbox_test

import (
	"encoding/json"
	"testing"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/outbox"
)

// TestFetchReadsOnlyItsWindow: a round's read visits about the rows of its
// window, whatever the backlog behind it, and the gauges' refresh one pass
// of the table, whatever plan PostgreSQL makes of the statements: before and after the table has statistics, with a
// custom plan and with the generic plan a prepared statement switches to
// after five executions (pgx prepares the relay's statements). The backlog
// is 2,000 rows delayed to tomorrow, then 20,000 undelayed rows, then 10
// rows whose retry is due. A plan that reads the due rows by walking every
// pending row in id order visited the whole backlog each round (found
// through make bench: the 100,000-row drain fell from 40,000-50,000 to
// 19,000 events/s).
func TestFetchReadsOnlyItsWindow(t *testing.T) {
	t.Parallel()
	const batch = 500
	pool := idemtest.ConnectPostgres(t).Pool // with idem_outbox
	ctx := t.Context()
	// No autovacuum: the test chooses when the table has statistics.
	for _, q := range []string{
		`ALTER TABLE idem_outbox SET (autovacuum_enabled = off)`,
		`INSERT INTO idem_outbox (topic, key, value, not_before, retry_at)
		 SELECT 't', convert_to('d' || i, 'UTF8'), '\x00', now() + interval '1 day', now() + interval '1 day'
		 FROM generate_series(1, 2000) i`,
		`INSERT INTO idem_outbox (topic, key, value)
		 SELECT 't', convert_to('k' || (i % 5000), 'UTF8'), '\x00' FROM generate_series(1, 20000) i`,
		`INSERT INTO idem_outbox (topic, key, value, attempts, retry_at)
		 SELECT 't', convert_to('r' || i, 'UTF8'), '\x00', 1, now() - interval '1 second' FROM generate_series(1, 10) i`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	fetch, err := outbox.FetchSQL("")
	if err != nil {
		t.Fatal(err)
	}
	stats, err := outbox.StatsSQL("")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	statements := []struct {
		name, prepare, execute string
		most                   float64
	}{
		// Rows of the window (500 read, 500 joined for their values) and
		// the due ones, with room for a plan that reads a few more.
		{"fetch", "PREPARE relay_fetch(bigint) AS " + fetch, "EXECUTE relay_fetch(500)", 3 * batch},
		// The gauges: one pass over the 22,010 rows, and the 2,010 waiting
		// rows once more (their keys), with room.
		{"stats", "PREPARE relay_stats AS " + stats, "EXECUTE relay_stats", 30_000},
	}
	for _, st := range statements {
		if _, err := conn.Exec(ctx, st.prepare); err != nil {
			t.Fatal(err)
		}
	}
	for _, tableStats := range []string{"no statistics", "analyzed"} {
		if tableStats == "analyzed" {
			if _, err := conn.Exec(ctx, "ANALYZE idem_outbox"); err != nil {
				t.Fatal(err)
			}
		}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
				t.Fatal(err)
			}
			for _, st := range statements {
				var plan []struct{ Plan planNode }
				if err := conn.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+st.execute).Scan(&plan); err != nil {
					t.Fatal(err)
				}
				n := plan[0].Plan.visited("idem_outbox")
				t.Logf("%s, %s, %s: %.0f rows visited", st.name, tableStats, mode, n)
				if n > st.most {
					j, _ := json.MarshalIndent(plan, "", " ")
					t.Errorf("%s, %s, %s: visited %.0f rows of the table, want at most %.0f; plan:\n%s", st.name, tableStats, mode, n, st.most, j)
				}
			}
		}
	}
	var heads int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM ("+fetch+") f", batch).Scan(&heads); err != nil {
		t.Fatal(err)
	}
	if heads != batch {
		t.Errorf("%d heads, want %d", heads, batch)
	}
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	Node      string     `json:"Node Type"`
	Index     string     `json:"Index Name,omitempty"`
	Relation  string     `json:"Relation Name"`
	Rows      float64    `json:"Actual Rows"`
	Loops     float64    `json:"Actual Loops"`
	Filtered  float64    `json:"Rows Removed by Filter"`
	Rechecked float64    `json:"Rows Removed by Index Recheck"`
	Plans     []planNode `json:"Plans"`
}

// visited is how many rows of table the nodes under n read: returned or
// removed by a filter, in every loop.
func (n planNode) visited(table string) float64 {
	var v float64
	if n.Relation == table {
		v = (n.Rows + n.Filtered + n.Rechecked) * n.Loops
	}
	for _, c := range n.Plans {
		v += c.visited(table)
	}
	return v
}
