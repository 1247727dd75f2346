package failidx

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/seal"
)

// querier is what the index needs from a database handle: *pgxpool.Pool satisfies
// it (and so do *pgx.Conn and pgx.Tx).
type querier interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var _ querier = (*pgxpool.Pool)(nil)

// Store reads the index and writes its audit table. It is safe for
// concurrent use.
type Store struct {
	db querier
	// sealer opens the values and headers sealed at rest (Sealed); nil:
	// sealed rows come back with PayloadErr set.
	sealer *seal.Sealer
}

// NewStore returns a Store on pool (whose search_path must reach the tables
// idem.Migrate created).
func NewStore(pool *pgxpool.Pool) *Store {
	if pool == nil {
		return &Store{} // tests without a database; writeAudit says so
	}
	return &Store{db: pool}
}

// maxLimit caps List's and Audit's page size.
const maxLimit = 1000

// recordCols are the columns scanRecord reads, in order.
const recordCols = `id, dlq_topic, dlq_partition, dlq_offset, origin_topic, origin_partition, origin_offset,
	consumer_group, fingerprint, kind, msg_key, idempotency_key, attempts, first_failure_at, last_failure_at,
	indexed_at, error, error_type, stack, value, value_size, value_truncated, stub, headers,
	status, status_actor, status_reason, status_at, coalesce(previous_id, 0), coalesce(key_id, 0)`

// listCols are recordCols without the value, the stack and the headers
// (NULL and empty in their places), for List: a page never reads payloads,
// and Store.open leaves such a row's payload unread (no PayloadErr).
var listCols = strings.NewReplacer("stack, value,", "'' AS stack, NULL::bytea AS value,", "stub, headers,", "stub, ''::bytea AS headers,").Replace(recordCols)

// scanRecord reads a row of recordCols. A sealed row (KeyID != 0) comes
// back without its value and headers, PayloadErr saying so, until
// Store.open opens it: a caller that forgets to never sees ciphertext.
func scanRecord(row pgx.Row) (Record, error) {
	var r Record
	var headers []byte
	var status string
	err := row.Scan(&r.ID, &r.Topic, &r.Partition, &r.Offset, &r.OriginTopic, &r.OriginPartition, &r.OriginOffset,
		&r.Group, &r.Fingerprint, &r.Kind, &r.Key, &r.IdempotencyKey, &r.Attempts, &r.FirstFailureAt, &r.LastFailureAt,
		&r.IndexedAt, &r.Error, &r.ErrorType, &r.Stack, &r.Value, &r.ValueSize, &r.ValueTruncated, &r.Stub, &headers,
		&status, &r.StatusActor, &r.StatusReason, &r.StatusAt, &r.PreviousID, &r.KeyID)
	if err != nil {
		return r, err
	}
	r.Status = Status(status)
	if r.KeyID != 0 {
		r.sealed = &sealedPayload{value: r.Value, headers: headers}
		r.Value, r.PayloadErr = nil, errNotOpened
		return r, nil
	}
	r.Headers, err = decodeHeaders(headers)
	return r, err
}

// where renders f as an SQL condition (always non-empty) appending its
// arguments to args.
func (f Filter) where(args *[]any) (string, error) {
	conds := []string{"true"}
	arg := func(v any) string {
		*args = append(*args, v)
		return "$" + strconv.Itoa(len(*args))
	}
	eq := func(col, v string) {
		if v != "" {
			conds = append(conds, col+" = "+arg(v))
		}
	}
	eq("consumer_group", f.Group)
	eq("dlq_topic", f.Topic)
	eq("kind", f.Kind)
	if fp := strings.ToLower(f.Fingerprint); fp != "" {
		for _, c := range fp {
			if !strings.ContainsRune("0123456789abcdef", c) {
				return "", invalid("fingerprint", "%q is not hexadecimal", f.Fingerprint)
			}
		}
		if len(fp) >= 12 {
			conds = append(conds, "fingerprint = "+arg(fp))
		} else {
			conds = append(conds, "fingerprint LIKE "+arg(fp+"%"))
		}
	}
	if f.Key != "" {
		conds = append(conds, "(idempotency_key = "+arg(f.Key)+" OR msg_key = "+arg([]byte(f.Key))+")")
	}
	if f.ErrorContains != "" {
		esc := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(f.ErrorContains)
		conds = append(conds, "error ILIKE "+arg("%"+esc+"%"))
	}
	if len(f.Status) > 0 {
		st := make([]string, 0, len(f.Status))
		for _, s := range f.Status {
			if !s.Valid() {
				return "", invalid("status", "%q: want unresolved, replaying, replayed, resolved or archived", s)
			}
			st = append(st, string(s))
		}
		if len(st) == 1 {
			conds = append(conds, "status = "+arg(st[0]))
		} else {
			conds = append(conds, "status = ANY("+arg(st)+"::text[])")
		}
	}
	if !f.Since.IsZero() {
		conds = append(conds, "last_failure_at >= "+arg(f.Since))
	}
	if !f.Until.IsZero() {
		conds = append(conds, "last_failure_at < "+arg(f.Until))
	}
	if f.HasOffset {
		conds = append(conds, "dlq_partition = "+arg(f.Partition), "dlq_offset = "+arg(f.Offset))
	}
	return strings.Join(conds, " AND "), nil
}

// encodeCursor and decodeCursor turn a List position into an opaque string.
func encodeCursor(t time.Time, id int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(t.UnixMicro(), 10) + "," + strconv.FormatInt(id, 10)))
}

func decodeCursor(c string) (time.Time, int64, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err == nil {
		if ts, id, ok := strings.Cut(string(b), ","); ok {
			us, err1 := strconv.ParseInt(ts, 10, 64)
			n, err2 := strconv.ParseInt(id, 10, 64)
			if err1 == nil && err2 == nil {
				return time.UnixMicro(us), n, nil
			}
		}
	}
	return time.Time{}, 0, invalid("cursor", "%q is not a cursor this index returned", c)
}

// List returns up to limit records matching f, latest failure first
// (LastFailureAt, then ID, descending), starting after cursor ("" for the
// first page). limit <= 0 means 50; it is capped at 1000. Value, Headers,
// Stack and Versions are not read (Get reads them); ValueSize is. A bad
// filter or cursor is a *ValidationError.
func (s *Store) List(ctx context.Context, f Filter, cursor string, limit int) (Page, error) {
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, maxLimit)
	var args []any
	cond, err := f.where(&args)
	if err != nil {
		return Page{}, err
	}
	if cursor != "" {
		t, id, err := decodeCursor(cursor)
		if err != nil {
			return Page{}, err
		}
		args = append(args, t, id)
		cond += fmt.Sprintf(" AND (last_failure_at, id) < ($%d, $%d)", len(args)-1, len(args))
	}
	args = append(args, limit+1)
	rows, err := s.db.Query(ctx, `SELECT `+listCols+` FROM idem_dlq_records WHERE `+cond+
		` ORDER BY last_failure_at DESC, id DESC LIMIT $`+strconv.Itoa(len(args)), args...)
	if err != nil {
		return Page{}, fmt.Errorf("index: list: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) { return scanRecord(row) })
	if err != nil {
		return Page{}, fmt.Errorf("index: list: %w", err)
	}
	if err := s.open(ctx, recs); err != nil {
		return Page{}, fmt.Errorf("index: list: %w", err)
	}
	p := Page{Records: recs}
	if len(recs) > limit {
		p.Records = recs[:limit]
		last := p.Records[limit-1]
		p.Next = encodeCursor(last.LastFailureAt, last.ID)
	}
	return p, nil
}

// Get returns record id with its Versions; an error wrapping ErrNotFound when
// the index has no such record.
func (s *Store) Get(ctx context.Context, id int64) (Record, error) {
	r, err := scanRecord(s.db.QueryRow(ctx, `SELECT `+recordCols+` FROM idem_dlq_records WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	if err != nil {
		return r, fmt.Errorf("index: get %d: %w", id, err)
	}
	recs := []Record{r}
	if err := s.open(ctx, recs); err != nil {
		return r, fmt.Errorf("index: get %d: %w", id, err)
	}
	r = recs[0]
	rows, err := s.db.Query(ctx, `SELECT n, value, actor, reason, at, coalesce(published_to, ''), coalesce(published_partition, 0),
		coalesce(published_offset, -1), coalesce(key_id, 0) FROM idem_dlq_versions WHERE record_id = $1 ORDER BY n`, id)
	if err != nil {
		return r, fmt.Errorf("index: get %d: versions: %w", id, err)
	}
	r.Versions, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Version, error) {
		var v Version
		err := row.Scan(&v.N, &v.Value, &v.Actor, &v.Reason, &v.At, &v.PublishedTo, &v.PublishedPartition, &v.PublishedOffset, &v.KeyID)
		return v, err
	})
	if err != nil {
		return r, fmt.Errorf("index: get %d: versions: %w", id, err)
	}
	if err := s.openVersions(ctx, id, r.Versions); err != nil {
		return r, fmt.Errorf("index: get %d: versions: %w", id, err)
	}
	return r, nil
}

// Groups returns the failure groups (fingerprint, kind, group, DLQ topic) of
// the records f matches, largest first, then latest first; at most 1000.
//
// A filter on group, topic, kind, fingerprint and status only is answered
// from the per-group counts the index keeps (fast at any size); FirstSeen
// and LastSeen then span every record the group has had, and SampleError is
// the error of its latest record. A filter on key, error text or time reads
// the matching records.
func (s *Store) Groups(ctx context.Context, f Filter) ([]FailureGroup, error) {
	if f.Key == "" && f.ErrorContains == "" && f.Since.IsZero() && f.Until.IsZero() && !f.HasOffset {
		return s.groupsFromCounts(ctx, f)
	}
	var args []any
	cond, err := f.where(&args)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `
		WITH g AS (
			SELECT fingerprint, kind, consumer_group, dlq_topic, count(*) AS n,
				count(*) FILTER (WHERE status = 'unresolved') AS unresolved,
				min(last_failure_at) AS first_seen, max(last_failure_at) AS last_seen
			FROM idem_dlq_records WHERE `+cond+`
			GROUP BY fingerprint, kind, consumer_group, dlq_topic
			ORDER BY n DESC, last_seen DESC, fingerprint
			LIMIT 1000
		)
		SELECT g.fingerprint, g.kind, g.consumer_group, g.dlq_topic, coalesce(sample.error, ''), coalesce(sample.id, 0),
			g.n, g.unresolved, g.first_seen, g.last_seen
		FROM g LEFT JOIN LATERAL (
			SELECT r.error, r.id FROM idem_dlq_records r
			WHERE r.fingerprint = g.fingerprint AND r.kind = g.kind AND r.consumer_group = g.consumer_group AND r.dlq_topic = g.dlq_topic
			ORDER BY r.status, r.last_failure_at DESC, r.id DESC LIMIT 1
		) sample ON true
		ORDER BY g.n DESC, g.last_seen DESC, g.fingerprint`, args...)
	if err != nil {
		return nil, fmt.Errorf("index: groups: %w", err)
	}
	return collectGroups(rows)
}

// groupsFromCounts is Groups from idem_dlq_groups.
func (s *Store) groupsFromCounts(ctx context.Context, f Filter) ([]FailureGroup, error) {
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	conds := []string{"true"}
	for col, v := range map[string]string{"consumer_group": f.Group, "dlq_topic": f.Topic, "kind": f.Kind} {
		if v != "" {
			conds = append(conds, col+" = "+arg(v))
		}
	}
	if f.Fingerprint != "" {
		fpCond, err := (Filter{Fingerprint: f.Fingerprint}).where(&args)
		if err != nil {
			return nil, err
		}
		conds = append(conds, fpCond)
	}
	statuses := f.Status
	if len(statuses) == 0 {
		statuses = []Status{Unresolved, Replaying, Replayed, Resolved, Archived}
	}
	var sum []string
	unresolved := "0"
	for _, st := range statuses {
		if !st.Valid() {
			return nil, invalid("status", "%q: want unresolved, replaying, replayed, resolved or archived", st)
		}
		sum = append(sum, string(st))
		if st == Unresolved {
			unresolved = "unresolved"
		}
	}
	n := "(" + strings.Join(sum, " + ") + ")"
	rows, err := s.db.Query(ctx, `SELECT fingerprint, kind, consumer_group, dlq_topic, sample_error, coalesce(sample_id, 0), `+n+`, `+unresolved+`, first_seen, last_seen
		FROM idem_dlq_groups WHERE `+strings.Join(conds, " AND ")+` AND `+n+` > 0
		ORDER BY `+n+` DESC, last_seen DESC, fingerprint LIMIT 1000`, args...)
	if err != nil {
		return nil, fmt.Errorf("index: groups: %w", err)
	}
	return collectGroups(rows)
}

func collectGroups(rows pgx.Rows) ([]FailureGroup, error) {
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (FailureGroup, error) {
		var g FailureGroup
		err := row.Scan(&g.Fingerprint, &g.Kind, &g.Group, &g.Topic, &g.SampleError, &g.SampleID, &g.Count, &g.Unresolved, &g.FirstSeen, &g.LastSeen)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("index: groups: %w", err)
	}
	return out, nil
}

// Overview returns one TopicSummary per group and DLQ topic that has records,
// ordered by group and topic.
func (s *Store) Overview(ctx context.Context) ([]TopicSummary, error) {
	rows, err := s.db.Query(ctx, `
		SELECT g.consumer_group, g.dlq_topic, g.unresolved,
			(SELECT min(r.last_failure_at) FROM idem_dlq_records r
			 WHERE r.status = 'unresolved' AND r.consumer_group = g.consumer_group AND r.dlq_topic = g.dlq_topic),
			(SELECT count(*) FROM idem_dlq_records r WHERE r.consumer_group = g.consumer_group AND r.dlq_topic = g.dlq_topic
				AND r.last_failure_at > now() - interval '1 hour')
		FROM (SELECT consumer_group, dlq_topic, sum(unresolved) AS unresolved, sum(unresolved + replaying + replayed + resolved + archived) AS total
			FROM idem_dlq_groups GROUP BY consumer_group, dlq_topic) g
		WHERE g.total > 0
		ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("index: overview: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TopicSummary, error) {
		var t TopicSummary
		var oldest *time.Time
		err := row.Scan(&t.Group, &t.Topic, &t.Unresolved, &oldest, &t.ArrivalsLastHour)
		if oldest != nil {
			t.OldestUnresolved = *oldest
		}
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("index: overview: %w", err)
	}
	return out, nil
}

// pageArgs reads a page of rows by descending id: limit (<= 0: 50, at most
// 1000) and the id the page starts below (cursor, the id of the previous
// page's last row; "" for the first page).
func pageArgs(cursor string, limit int) (int, int64, error) {
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, maxLimit)
	before := int64(1<<63 - 1)
	if cursor != "" {
		n, err := strconv.ParseInt(cursor, 10, 64)
		if err != nil || n <= 0 {
			return 0, 0, invalid("cursor", "%q is not a cursor of this list", cursor)
		}
		before = n
	}
	return limit, before, nil
}

// nextPage cuts rows (read with limit+1) to limit and returns the next
// page's cursor ("" on the last page).
func nextPage[T any](rows []T, limit int, id func(T) int64) ([]T, string) {
	if len(rows) <= limit {
		return rows, ""
	}
	rows = rows[:limit]
	return rows, strconv.FormatInt(id(rows[limit-1]), 10)
}

// Sweep deletes resolved, replayed and archived records whose status changed
// more than olderThan ago (with their versions), in batches of 10,000, and
// returns how many it deleted. Unresolved records, and records a job holds
// (replaying), are never swept. Audit rows
// are kept. index.Indexer.Run calls it every hour with Indexer.Retention.
func (s *Store) Sweep(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, invalid("olderThan", "%v: must be >= 0", olderThan)
	}
	var total int64
	for {
		tag, err := s.db.Exec(ctx, `DELETE FROM idem_dlq_records WHERE id IN (
			SELECT id FROM idem_dlq_records WHERE status <> 'unresolved' AND status <> 'replaying'
			AND status_at < now() - $1::interval LIMIT 10000)`,
			olderThan)
		if err != nil {
			return total, fmt.Errorf("index: sweep: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 10000 {
			return total, nil
		}
	}
}

// clean makes s storable in a text column: valid UTF-8 without NUL bytes.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// SettledUpTo returns, for each partition of the dead-letter topic that the
// index holds records of, the offset up to which every record it holds
// there is settled (replayed, resolved or archived): the offset of the
// first record not settled (unresolved, or a job's), else the offset after
// the last record it holds. The indexer moves the topic's admin group
// there, so that idem_dlq_depth stops counting what the index settled.
func (s *Store) SettledUpTo(ctx context.Context, topic string, partitions []int32) (map[int32]int64, error) {
	out := map[int32]int64{}
	for _, p := range partitions {
		var at *int64
		err := s.db.QueryRow(ctx, `SELECT coalesce(
			(SELECT min(dlq_offset) FROM idem_dlq_records WHERE dlq_topic = $1 AND dlq_partition = $2 AND status IN ('unresolved', 'replaying')),
			(SELECT max(dlq_offset) + 1 FROM idem_dlq_records WHERE dlq_topic = $1 AND dlq_partition = $2))`, topic, p).Scan(&at)
		if err != nil {
			return nil, fmt.Errorf("index: settled records of %s/%d: %w", topic, p, err)
		}
		if at != nil {
			out[p] = *at
		}
	}
	return out, nil
}

// HoldsTopic reports whether the index holds any record of the dead-letter
// topic, whatever its status.
func (s *Store) HoldsTopic(ctx context.Context, topic string) (bool, error) {
	var any bool
	if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM idem_dlq_records WHERE dlq_topic = $1)`, topic).Scan(&any); err != nil {
		return false, fmt.Errorf("index: records of %s: %w", topic, err)
	}
	return any, nil
}
