package tables

import (
	"fmt"
	"slices"
	"testing"

	"github.com/idemhq/idem/internal/pgmigrate"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestMigrateFromEachEarlierVersion: Migrate brings a database to the same
// index from every earlier state — none, 0001, 0001+0002 (masking and
// encryption first), 0001+0003 (claims first; 0002 then runs after it) —
// and the per-group counts then both name their sample record (0002) and
// count claimed records (0003).
func TestMigrateFromEachEarlierVersion(t *testing.T) {
	all, err := pgmigrate.Load(migrationFS, "migrations/index", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, before := range [][]int{nil, {1}, {1, 2}, {1, 3}} {
		t.Run(fmt.Sprint(before), func(t *testing.T) {
			pool, _ := testenv.PostgresSchema(t)
			ctx := testenv.Context(t)
			var first []pgmigrate.Migration
			for _, m := range all {
				if slices.Contains(before, m.Version) {
					first = append(first, m)
				}
			}
			if len(first) > 0 {
				if err := pgmigrate.Apply(ctx, pool, "console-index", first); err != nil {
					t.Fatal(err)
				}
			}
			if err := MigrateIndex(ctx, pool); err != nil {
				t.Fatal(err)
			}
			var latest int64
			err := pool.QueryRow(ctx, `WITH ins AS (
				INSERT INTO idem_dlq_records (dlq_topic, dlq_partition, dlq_offset, consumer_group, fingerprint, kind, error,
					first_failure_at, last_failure_at, key_id)
				VALUES ('t.g.dlq', 0, 0, 'g', 'fp', 'permanent', 'older', now() - interval '2 min', now() - interval '2 min', NULL),
				       ('t.g.dlq', 0, 1, 'g', 'fp', 'permanent', 'newer', now() - interval '1 min', now() - interval '1 min', 7)
				RETURNING id, error) SELECT id FROM ins WHERE error = 'newer'`).Scan(&latest)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `UPDATE idem_dlq_records SET status = 'replaying', job_id = 1 WHERE id = $1`, latest); err != nil {
				t.Fatal(err)
			}
			var sampleID *int64
			var sample string
			var unresolved, replaying int64
			if err := pool.QueryRow(ctx, `SELECT sample_id, sample_error, unresolved, replaying FROM idem_dlq_groups WHERE fingerprint = 'fp'`).
				Scan(&sampleID, &sample, &unresolved, &replaying); err != nil {
				t.Fatal(err)
			}
			if sampleID == nil || *sampleID != latest || sample != "newer" || unresolved != 1 || replaying != 1 {
				t.Errorf("group: sample %v %q, unresolved %d, replaying %d; want sample %d \"newer\", 1 and 1", sampleID, sample, unresolved, replaying, latest)
			}
			for _, table := range []string{"idem_dlq_jobs", "idem_console_sessions"} {
				var ok bool
				if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil || !ok {
					t.Errorf("table %s: %v %v", table, ok, err)
				}
			}
			if _, err := pool.Exec(ctx, `INSERT INTO idem_dlq_versions (record_id, n, value, actor, key_id) VALUES ($1, 1, '\x00', 'a', 7)`, latest); err != nil {
				t.Errorf("an unpublished, sealed version: %v", err)
			}
		})
	}
}
