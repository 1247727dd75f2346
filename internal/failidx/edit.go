package failidx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/wire"
)

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
