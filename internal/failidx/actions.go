package failidx

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/internal/replayrec"
	"github.com/idemhq/idem/internal/wire"
)

// headerReplaces is the header EditAndRetry adds to the record it publishes:
// the DLQ record it replaces, as "<topic>/<partition>/<offset>". The record
// also carries idem-replay-of (wire.HeaderReplayOf) with the same value, the link the indexer
// follows; idem-replaces alone says the value was edited.
const headerReplaces = "idem-replaces"

// Actions change the index and publish to Kafka on an operator's behalf. Every
// action writes one AuditEntry (who, what, which records, why, the result),
// also when it fails. It is safe for concurrent use.
type Actions struct {
	// ReplayTopics are topics a replay may target besides each record's
	// origin topic and the origin's retry tiers for the record's group.
	ReplayTopics []string

	store  *Store
	client sarama.Client
	owner  string        // names a as the holder of the jobs it runs
	lease  time.Duration // how old a job's heartbeat may get before another process takes it over
	// afterSend, when set (tests), is called after each send of a job
	// acknowledged, before it is recorded; errCrash stops the job there as
	// a crash would.
	afterSend func(id int64) error
}

// NewActions returns Actions on s that publish through client. client must be
// set up for producing as retrytopic.ConfigureProducer describes, with
// Metadata.AllowAutoTopicCreation = false (ProducerConfig does both); the
// caller keeps owning it. client may be nil for Resolve, Archive and the
// outbox actions; Replay, EditAndRetry and ReleaseKey then fail.
func NewActions(s *Store, client sarama.Client) *Actions {
	return &Actions{store: s, client: client, owner: newOwner(), lease: defaultLease}
}

// errNoClient is returned by actions that publish when NewActions had no client.
var errNoClient = errors.New("index: this action publishes to Kafka, and Actions has no client (NewActions(s, nil))")

// audit writes one audit row for an action whose outcome is res and err;
// it returns err, joined with the audit's own error if that failed.
func (a *Actions) audit(ctx context.Context, actor, action string, ids []int64, detail, reason string, res Result, err error, done string) error {
	aerr := writeAudit(context.WithoutCancel(ctx), a.store.db, AuditEntry{Actor: actor, Action: action, RecordIDs: ids,
		Detail: detail, Reason: reason, Result: auditResult(res, err, done)})
	if aerr != nil {
		return errors.Join(err, aerr)
	}
	return err
}

// auditResult is an audit row's result: "ok: …" with the counts of res, or
// the error after them.
func auditResult(res Result, err error, done string) string {
	if err != nil {
		return fmt.Sprintf("error after %d %s: %v", res.Done, done, err)
	}
	result := fmt.Sprintf("ok: %d %s", res.Done, done)
	if res.Skipped > 0 {
		result += fmt.Sprintf(", %d skipped", res.Skipped)
	}
	if len(res.SkippedStubs) > 0 {
		result += fmt.Sprintf(" (%d stubs)", len(res.SkippedStubs))
	}
	if len(res.Errors) > 0 {
		result += fmt.Sprintf(", %d errors: %s", len(res.Errors), strings.Join(res.Errors, "; "))
	}
	return result
}

// checkActor rejects an action without an actor.
func checkActor(actor string) error {
	if strings.TrimSpace(actor) == "" {
		return invalid("actor", "empty: every action is audited under a name")
	}
	return nil
}

// resolve returns the ids sel picks, in ascending order. Explicit ids must
// all be in the index (else an error wrapping ErrNotFound).
func (a *Actions) resolve(ctx context.Context, sel Selection) ([]int64, error) {
	switch {
	case len(sel.IDs) > 0 && sel.Filter != nil:
		return nil, invalid("selection", "give ids or a filter, not both")
	case len(sel.IDs) > 0:
		rows, err := a.store.db.Query(ctx, `SELECT id FROM idem_dlq_records WHERE id = ANY($1) ORDER BY id`, sel.IDs)
		if err != nil {
			return nil, fmt.Errorf("index: select records: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, fmt.Errorf("index: select records: %w", err)
		}
		var missing []string
		for _, id := range sel.IDs {
			if _, found := slicesFind(ids, id); !found {
				missing = append(missing, strconv.FormatInt(id, 10))
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("%w: id %s", ErrNotFound, strings.Join(missing, ", "))
		}
		return ids, nil
	case sel.Filter != nil:
		var args []any
		cond, err := sel.Filter.where(&args)
		if err != nil {
			return nil, err
		}
		rows, err := a.store.db.Query(ctx, `SELECT id FROM idem_dlq_records WHERE `+cond+` ORDER BY id`, args...)
		if err != nil {
			return nil, fmt.Errorf("index: select records: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, fmt.Errorf("index: select records: %w", err)
		}
		return ids, nil
	}
	return nil, invalid("selection", "empty: give record ids or a filter")
}

// slicesFind looks id up in sorted ids.
func slicesFind(ids []int64, id int64) (int, bool) {
	lo, hi := 0, len(ids)
	for lo < hi {
		m := (lo + hi) / 2
		if ids[m] < id {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(ids) && ids[lo] == id
}

// filterDetail describes a selection for the audit.
func (sel Selection) detail() string {
	if sel.Filter == nil {
		return fmt.Sprintf("%d ids", len(sel.IDs))
	}
	f := sel.Filter
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("group", f.Group)
	add("topic", f.Topic)
	add("kind", f.Kind)
	add("fingerprint", f.Fingerprint)
	add("key", f.Key)
	add("error~", f.ErrorContains)
	for _, s := range f.Status {
		add("status", string(s))
	}
	if !f.Since.IsZero() {
		add("since", f.Since.UTC().Format(time.RFC3339))
	}
	if !f.Until.IsZero() {
		add("until", f.Until.UTC().Format(time.RFC3339))
	}
	if f.HasOffset {
		add("at", fmt.Sprintf("%d/%d", f.Partition, f.Offset))
	}
	return "filter " + strings.Join(parts, ",")
}

// setStatus moves the records ids whose status is one of from to status and
// returns the ids it changed.
func setStatus(ctx context.Context, db querier, ids []int64, from []Status, to Status, actor, reason string) ([]int64, error) {
	fs := make([]string, len(from))
	for i, s := range from {
		fs[i] = string(s)
	}
	rows, err := db.Query(ctx, `UPDATE idem_dlq_records SET status = $2, status_actor = $3, status_reason = $4, status_at = now()
		WHERE id = ANY($1) AND status = ANY($5::text[]) RETURNING id`, ids, string(to), clean(actor), clean(reason), fs)
	if err != nil {
		return nil, fmt.Errorf("index: set status %s: %w", to, err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("index: set status %s: %w", to, err)
	}
	return done, nil
}

// transition is Resolve and Archive: a status change without publishing.
func (a *Actions) transition(ctx context.Context, action, actor string, sel Selection, reason string, from []Status, to Status) (Result, error) {
	var res Result
	if err := checkActor(actor); err != nil {
		return res, err
	}
	ids, err := a.resolve(ctx, sel)
	if err != nil {
		return res, a.audit(ctx, actor, action, sel.IDs, sel.detail(), reason, res, err, string(to))
	}
	res.Matched = len(ids)
	done, err := setStatus(ctx, a.store.db, ids, from, to, actor, reason)
	res.Done = len(done)
	res.Skipped = res.Matched - res.Done
	return res, a.audit(ctx, actor, action, ids, sel.detail(), reason, res, err, string(to))
}

// Resolve marks the selected unresolved or replayed records Resolved (nothing
// is sent). Archived and resolved records are skipped.
func (a *Actions) Resolve(ctx context.Context, actor string, sel Selection, reason string) (Result, error) {
	return a.transition(ctx, "resolve", actor, sel, reason, []Status{Unresolved, Replayed}, Resolved)
}

// Archive marks the selected records Archived (nothing is sent). reason is
// required: without one the error is a *ValidationError and nothing changes.
// Archived records are skipped.
func (a *Actions) Archive(ctx context.Context, actor string, sel Selection, reason string) (Result, error) {
	if strings.TrimSpace(reason) == "" {
		if err := checkActor(actor); err != nil {
			return Result{}, err
		}
		return Result{}, a.audit(ctx, actor, "archive", sel.IDs, sel.detail(), reason, Result{}, invalid("reason", "archiving needs a reason"), "archived")
	}
	return a.transition(ctx, "archive", actor, sel, reason, []Status{Unresolved, Replayed, Resolved}, Archived)
}

// Replay sends the selected unresolved records back: to each record's origin
// topic (to == "") as a fresh record without idem-* headers, or to the topic
// named by to, keeping the idem-* history, due now. to must be a retry tier
// of each record's origin topic for its group ("<origin>.<group>.retry.<n>")
// or one of ReplayTopics; anything else is a *ValidationError on "to" and
// nothing is claimed. Key, value and original headers (idempotency key
// included) are kept byte for byte, so a record that was in fact handled is
// a duplicate the consumer's inbox drops. ratePerSec > 0 paces the sends.
// Each record sent is marked Replayed (actor, reason); records not selected
// stay as they are.
//
// It is StartReplay then RunJob in the caller's goroutine: the records are
// claimed first, so a record two replays select is sent by one of them
// only. Stubs are never replayed: they are counted in Result.SkippedStubs.
// Records that are not unresolved (or another action claimed) are skipped
// (Result.Skipped). Every destination is checked before anything is
// claimed: a topic that does not exist is an error (wrapping
// dlq.ErrUnknownTopic) and nothing is published or changed. An id that is
// not in the index is an error wrapping ErrNotFound, before anything is
// sent. A record whose value the index holds truncated is read back from
// Kafka; if it has expired there, it is left unresolved and named in
// Result.Errors.
func (a *Actions) Replay(ctx context.Context, actor string, sel Selection, to string, ratePerSec int, reason string) (Result, error) {
	j, err := a.StartReplay(ctx, actor, sel, to, ratePerSec, reason)
	if err != nil {
		return Result{}, err
	}
	j, err = a.RunJob(ctx, j.ID)
	return j.Result(), err
}

func orOrigin(to string) string {
	if to == "" {
		return replayrec.ToSource
	}
	return to
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// deadLetter rebuilds r as a replay reads a dead letter (what
// replayrec.Build takes); a truncated value is read back from the DLQ topic.
func (a *Actions) deadLetter(ctx context.Context, r Record) (replayrec.DeadLetter, error) {
	if r.PayloadErr != nil {
		return replayrec.DeadLetter{}, fmt.Errorf("record %d: its value and headers cannot be read: %w", r.ID, r.PayloadErr)
	}
	if r.ValueTruncated {
		got, err := dlq.New(a.client).Show(ctx, r.Topic, dlq.Position{Partition: r.Partition, Offset: r.Offset})
		if err != nil {
			return replayrec.DeadLetter{}, fmt.Errorf("record %d: the index holds its value truncated (%d of %d bytes) and it cannot be read from %s/%d offset %d: %w",
				r.ID, len(r.Value), r.ValueSize, r.Topic, r.Partition, r.Offset, err)
		}
		return replayrec.DeadLetter{Topic: got.Topic, Partition: got.Partition, Offset: got.Offset, Key: got.Key, Value: got.Value,
			Headers: got.Headers, Failure: got.Failure, HasFailure: got.HasFailure}, nil
	}
	hs := make([]sarama.RecordHeader, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = sarama.RecordHeader{Key: h.Key, Value: h.Value}
	}
	f, ok, _ := wire.Decode(hs) // as dlq.FromMessage: a header that does not parse leaves its field zero
	return replayrec.DeadLetter{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value,
		Headers: hs, Failure: f, HasFailure: ok}, nil
}

// EditAndRetry publishes value in place of record id's value to the record's
// origin topic, with its Kafka key and original headers (so under the same
// idempotency key) and two headers naming the DLQ record as
// "<topic>/<partition>/<offset>": idem-replaces (this record is an edit of
// it) and idem-replay-of (wire.HeaderReplayOf, as every replay carries, so a
// failure of the edited record is linked to it as a replay's is). value must
// be valid JSON when the original was JSON, and must keep every JSON string
// field that held the idempotency key; otherwise, or when value is empty,
// the error is a *ValidationError and nothing is published or changed.
//
// Only an unresolved record is edited: it is claimed (with the edited value
// stored as a new Version beside the original, which is never overwritten)
// in the statement that selects it, then published by a job (RunJob, in the
// caller's goroutine), then marked Replayed. A record that is not
// unresolved, or that another action claimed first, is an error wrapping
// ErrConflict and nothing is published. An unknown id is an error wrapping
// ErrNotFound; an origin topic that does not exist, an error wrapping
// dlq.ErrUnknownTopic (nothing published).
func (a *Actions) EditAndRetry(ctx context.Context, actor string, id int64, value []byte, reason string) (Result, error) {
	j, err := a.StartEdit(ctx, actor, id, value, reason)
	if err != nil {
		return Result{Matched: j.Matched}, err
	}
	j, err = a.RunJob(ctx, j.ID)
	return j.Result(), err
}

// StartEdit is EditAndRetry without the publish: it checks the edit, claims
// the record and stores the edited value, and returns the job (owned by a)
// that RunJob runs to publish it.
func (a *Actions) StartEdit(ctx context.Context, actor string, id int64, value []byte, reason string) (Job, error) {
	res := Result{Matched: 1}
	if err := checkActor(actor); err != nil {
		return Job{}, err
	}
	detail := fmt.Sprintf("record %d", id)
	fail := func(err error) (Job, error) {
		return Job{Matched: res.Matched}, a.audit(ctx, actor, "edit-retry", []int64{id}, detail, reason, res, err, "published")
	}
	r, err := a.store.Get(ctx, id)
	if err != nil {
		res.Matched = 0
		return fail(err)
	}
	if r.PayloadErr != nil {
		return fail(invalid("value", "record %d: its value and headers cannot be read (%v): there is nothing to edit", id, r.PayloadErr))
	}
	if r.Status != Unresolved {
		return fail(fmt.Errorf("%w: record %d is %s: only an unresolved record is edited and retried", ErrConflict, id, r.Status))
	}
	if err := checkEdit(r, value); err != nil {
		return fail(err)
	}
	if a.client == nil {
		return fail(errNoClient)
	}
	if r.OriginTopic == "" {
		return fail(invalid("to", "record %d has no origin topic (no idem-original-topic)", id))
	}
	if err := dlq.New(a.client).CheckTopic(r.OriginTopic); err != nil {
		return fail(fmt.Errorf("index: edit and retry record %d: nothing published: %w", id, err))
	}
	var j Job
	err = pgx.BeginFunc(ctx, a.store.db, func(tx pgx.Tx) error {
		var jobID int64
		if err := tx.QueryRow(ctx, `INSERT INTO idem_dlq_jobs (action, actor, reason, detail, to_topic, record_ids, matched, claimed, owner, heartbeat_at)
			VALUES ('edit-retry', $1, $2, $3, $4, $5, 1, 1, $6, now()) RETURNING id`,
			clean(actor), clean(reason), detail, r.OriginTopic, []int64{id}, a.owner).Scan(&jobID); err != nil {
			return err
		}
		var status string
		err := tx.QueryRow(ctx, `WITH c AS (UPDATE idem_dlq_records SET status = 'replaying', job_id = $2, status_actor = $3,
			status_reason = $4, status_at = now(), publish_topic = NULL, publish_partition = NULL, publish_from = NULL
			WHERE id = $1 AND status = 'unresolved' RETURNING id)
			SELECT CASE WHEN EXISTS (SELECT 1 FROM c) THEN 'claimed' ELSE (SELECT status FROM idem_dlq_records WHERE id = $1) END`,
			id, jobID, clean(actor), clean(reason)).Scan(&status)
		if err != nil {
			return err
		}
		if status != "claimed" {
			return fmt.Errorf("%w: record %d is %s: only an unresolved record is edited and retried", ErrConflict, id, status)
		}
		stored, keyID, err := a.store.sealVersion(ctx, tx, id, value)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO idem_dlq_versions (record_id, n, value, actor, reason, key_id)
			SELECT $1, coalesce(max(n), 0) + 1, $2, $3, $4, $5 FROM idem_dlq_versions WHERE record_id = $1`,
			id, stored, clean(actor), clean(reason), keyID); err != nil {
			return err
		}
		j, err = scanJob(tx.QueryRow(ctx, `SELECT `+jobCols+` FROM idem_dlq_jobs WHERE id = $1`, jobID))
		return err
	})
	if err != nil {
		if !errors.Is(err, ErrConflict) {
			err = fmt.Errorf("index: edit and retry record %d: %w", id, err)
		}
		return fail(err)
	}
	return j, nil
}

// editRecord is the record EditAndRetry publishes for r with value.
func editRecord(r Record, value []byte) forward.Record {
	orig := make([]sarama.RecordHeader, 0, len(r.Headers))
	for _, h := range r.Headers {
		orig = append(orig, sarama.RecordHeader{Key: h.Key, Value: h.Value})
	}
	// idem-replaces says this is an edit; idem-replay-of, the link every
	// replay carries and the indexer follows, names the same dead letter.
	hs := wire.WithReplayOf(wire.StripHeaders(orig), r.Topic, r.Partition, r.Offset)
	hs = slices.DeleteFunc(hs, func(h sarama.RecordHeader) bool { return string(h.Key) == headerReplaces })
	hs = append(hs, sarama.RecordHeader{Key: []byte(headerReplaces), Value: []byte(wire.ReplayOf(r.Topic, r.Partition, r.Offset))})
	return forward.Record{Topic: r.OriginTopic, Partition: r.OriginPartition, Key: r.Key, Value: value, Headers: hs}
}

// checkEdit validates an edited value against the original record.
func checkEdit(r Record, value []byte) error {
	if len(bytes.TrimSpace(value)) == 0 {
		return invalid("value", "empty: give the edited value")
	}
	origJSON := len(r.Value) > 0 && !r.ValueTruncated && json.Valid(r.Value)
	if !origJSON {
		return nil
	}
	if !json.Valid(value) {
		var v any
		err := json.Unmarshal(value, &v)
		return invalid("value", "not valid JSON (the original is): %v", err)
	}
	if r.IdempotencyKey == "" {
		return nil
	}
	var before, after any
	if json.Unmarshal(r.Value, &before) != nil || json.Unmarshal(value, &after) != nil {
		return nil
	}
	for _, path := range keyPaths(before, r.IdempotencyKey, "") {
		if got, ok := lookup(after, path); !ok || got != r.IdempotencyKey {
			return invalid("value", "field %s holds the idempotency key %q in the original and must keep it (the edit is published under the same key)", path, r.IdempotencyKey)
		}
	}
	return nil
}

// keyPaths returns the paths ("a.b.0") of the string fields of v equal to key.
func keyPaths(v any, key, at string) []string {
	var out []string
	switch v := v.(type) {
	case string:
		if v == key && at != "" {
			out = append(out, at)
		}
	case map[string]any:
		for k, x := range v {
			out = append(out, keyPaths(x, key, join(at, k))...)
		}
	case []any:
		for i, x := range v {
			out = append(out, keyPaths(x, key, join(at, strconv.Itoa(i)))...)
		}
	}
	return out
}

func join(at, k string) string {
	if at == "" {
		return k
	}
	return at + "." + k
}

// lookup returns the string at path in v.
func lookup(v any, path string) (string, bool) {
	for _, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[k]
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(x) {
				return "", false
			}
			v = x[i]
		default:
			return "", false
		}
	}
	s, ok := v.(string)
	return s, ok
}

// publisher sends records and returns where they landed, keeping the
// record's partition number when the topic has it (else hashing the key).
type publisher struct {
	client   sarama.Client
	producer sarama.SyncProducer
}

func newPublisher(client sarama.Client) (*publisher, error) {
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("index: producer: %w", err)
	}
	return &publisher{client: client, producer: p}, nil
}

func (p *publisher) close() { _ = p.producer.Close() }

func (p *publisher) send(ctx context.Context, rec forward.Record) (int32, int64, error) {
	part, err := p.partition(rec)
	if err != nil {
		return 0, 0, err
	}
	off, err := p.sendTo(ctx, rec, part)
	return part, off, err
}

// partition returns the partition rec goes to: its own number when topic
// has it, else its key's hash.
func (p *publisher) partition(rec forward.Record) (int32, error) {
	parts, err := p.client.Partitions(rec.Topic)
	if err != nil {
		return 0, fmt.Errorf("partitions of %s: %w", rec.Topic, err)
	}
	n := int32(len(parts))
	part := rec.Partition
	if part < 0 || part >= n {
		hp := sarama.NewHashPartitioner(rec.Topic)
		if part, err = hp.Partition(&sarama.ProducerMessage{Key: sarama.ByteEncoder(rec.Key)}, n); err != nil {
			return 0, err
		}
	}
	return part, nil
}

// sendTo sends rec to partition part and returns its offset.
func (p *publisher) sendTo(ctx context.Context, rec forward.Record, part int32) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	msg := &sarama.ProducerMessage{Topic: rec.Topic, Partition: part, Headers: rec.Headers}
	if rec.Key != nil {
		msg.Key = sarama.ByteEncoder(rec.Key)
	}
	if rec.Value != nil {
		msg.Value = sarama.ByteEncoder(rec.Value)
	}
	_, off, err := p.producer.SendMessage(msg)
	return off, err
}

// isUndefinedTable reports whether err is PostgreSQL's undefined_table.
func isUndefinedTable(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "42P01"
}

// parkedPage is one page of the keys ordering holds blocked, after the key
// ($1, $2, $3) in (group, topic, key digest) order: the head rows and the
// parked rows of each key, aggregated for that page only.
const parkedPage = `
WITH h AS (
	SELECT consumer_group, topic, key_digest, msg_key, head_key, since FROM idem_ordering_heads
	WHERE (consumer_group, topic, key_digest) > ($1, $2, $3)
	ORDER BY consumer_group, topic, key_digest LIMIT $4
), p AS (
	SELECT consumer_group, topic, key_digest, (array_agg(msg_key))[1] AS msg_key, count(*) AS n, min(parked_at) AS oldest
	FROM idem_ordering_parked WHERE NOT drained AND (consumer_group, topic, key_digest) > ($1, $2, $3)
	  AND (consumer_group, topic, key_digest) IN (
		SELECT DISTINCT consumer_group, topic, key_digest FROM idem_ordering_parked
		WHERE NOT drained AND (consumer_group, topic, key_digest) > ($1, $2, $3)
		ORDER BY consumer_group, topic, key_digest LIMIT $4)
	GROUP BY consumer_group, topic, key_digest
)
SELECT coalesce(h.consumer_group, p.consumer_group), coalesce(h.topic, p.topic), coalesce(h.key_digest, p.key_digest),
	coalesce(h.msg_key, p.msg_key), coalesce(h.head_key, ''), h.since, coalesce(p.n, 0), p.oldest
FROM h FULL JOIN p ON h.consumer_group = p.consumer_group AND h.topic = p.topic AND h.key_digest = p.key_digest
ORDER BY 1, 2, 3 LIMIT $4`

// ParkedKeys returns up to limit keys ByKey ordering holds blocked, every
// group and topic, in (group, topic, key digest) order, starting after
// cursor ("" for the first page), and the next page's cursor ("" on the
// last page): the page is cut in SQL, whatever the number of keys. None
// when the ordering tables do not exist. limit <= 0 means 100; it is capped
// at 1000. A cursor this method did not return is a *ValidationError.
func (a *Actions) ParkedKeys(ctx context.Context, cursor string, limit int) ([]ParkedKey, string, error) {
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, maxLimit)
	after := [3]string{}
	var digest []byte
	if cursor != "" {
		raw, err := base64.RawURLEncoding.DecodeString(cursor)
		parts := strings.SplitN(string(raw), "\x00", 3)
		if err != nil || len(parts) != 3 {
			return nil, "", invalid("cursor", "%q is not a cursor of the parked keys", cursor)
		}
		after = [3]string{parts[0], parts[1], parts[2]}
		if digest, err = hex.DecodeString(after[2]); err != nil {
			return nil, "", invalid("cursor", "%q is not a cursor of the parked keys", cursor)
		}
	}
	if digest == nil {
		digest = []byte{}
	}
	rows, err := a.store.db.Query(ctx, parkedPage, after[0], after[1], digest, limit+1)
	if isUndefinedTable(err) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("index: parked keys: %w", err)
	}
	type row struct {
		k      ParkedKey
		digest []byte
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		var key []byte
		var since, oldest *time.Time
		err := r.Scan(&x.k.Group, &x.k.Topic, &x.digest, &key, &x.k.Head, &since, &x.k.Parked, &oldest)
		x.k.Key = string(key)
		switch {
		case oldest != nil:
			x.k.Since = *oldest
		case since != nil:
			x.k.Since = *since
		}
		return x, err
	})
	if isUndefinedTable(err) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("index: parked keys: %w", err)
	}
	next := ""
	if len(got) > limit {
		got = got[:limit]
		last := got[limit-1]
		next = base64.RawURLEncoding.EncodeToString([]byte(last.k.Group + "\x00" + last.k.Topic + "\x00" + hex.EncodeToString(last.digest)))
	}
	out := make([]ParkedKey, len(got))
	for i, x := range got {
		out[i] = x.k
	}
	return out, next, nil
}

// ReleaseKey gives up the ordering of key in group and topic, as `idem
// ordering release --to source` does: the head's pending forward and every
// parked message go back to the source topic, in order, as fresh records
// (idem-* headers removed; idempotency key kept), then the key is unblocked.
// Result.Done counts the records sent. A key that is not blocked is an error
// wrapping ErrNotFound.
func (a *Actions) ReleaseKey(ctx context.Context, actor, group, topic, key, reason string) (Result, error) {
	var res Result
	if err := checkActor(actor); err != nil {
		return res, err
	}
	detail := fmt.Sprintf("group %s topic %s key %q", group, topic, key)
	fail := func(err error) (Result, error) {
		return res, a.audit(ctx, actor, "release-key", nil, detail, reason, res, err, "released")
	}
	if a.client == nil {
		return fail(errNoClient)
	}
	blocked, err := keyorder.List(ctx, a.store.db, group, topic)
	if err != nil && !isUndefinedTable(err) {
		return fail(fmt.Errorf("index: release key: %w", err))
	}
	found := false
	for _, b := range blocked {
		found = found || string(b.Key) == key
	}
	if !found {
		return fail(fmt.Errorf("%w: key %q is not blocked in group %s topic %s", ErrNotFound, key, group, topic))
	}
	res.Matched = 1
	if err := dlq.New(a.client).CheckTopic(topic); err != nil {
		return fail(err)
	}
	pub, err := newPublisher(a.client)
	if err != nil {
		return fail(err)
	}
	defer pub.close()
	n, err := keyorder.New(a.store.db, group).Release(ctx, topic, []byte(key), func(r keyorder.Record) error {
		hs := make([]sarama.RecordHeader, 0, len(r.Headers))
		for _, h := range r.Headers {
			hs = append(hs, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
		_, _, err := pub.send(ctx, forward.Record{Topic: topic, Partition: r.Partition, Key: r.Key, Value: r.Value,
			Headers: wire.StripHeaders(hs)})
		return err
	})
	res.Done = n
	if err != nil {
		return fail(err)
	}
	return res, a.audit(ctx, actor, "release-key", nil, detail, reason, res, nil, "released")
}

// FailedOutbox returns up to limit outbox rows (idem_outbox) in the failed
// state, lowest id first (none when the table does not exist). limit <= 0
// means 100.
func (a *Actions) FailedOutbox(ctx context.Context, limit int) ([]OutboxRow, error) {
	rows, err := outboxstore.List(ctx, a.store.db, outboxstore.ListOptions{State: outboxstore.StateFailed, Limit: limit})
	if isUndefinedTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("index: failed outbox rows: %w", err)
	}
	out := make([]OutboxRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, OutboxRow{ID: r.ID, Topic: r.Topic, Key: string(r.Key), Error: r.LastError, Attempts: r.Attempts, CreatedAt: r.CreatedAt})
	}
	return out, nil
}

// RetryOutbox makes the failed outbox rows ids pending again:
// the relay publishes them again. Rows that are not failed are skipped.
func (a *Actions) RetryOutbox(ctx context.Context, actor string, ids []int64, reason string) (Result, error) {
	res := Result{Matched: len(ids)}
	if err := checkActor(actor); err != nil {
		return Result{}, err
	}
	if len(ids) == 0 {
		return Result{}, invalid("ids", "empty: give the outbox rows to retry")
	}
	done, err := outboxstore.Retry(ctx, a.store.db, "", ids...)
	res.Done = len(done)
	res.Skipped = res.Matched - res.Done
	return res, a.audit(ctx, actor, "retry-outbox", ids, "outbox rows", reason, res, err, "retried")
}
