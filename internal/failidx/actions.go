package failidx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// isUndefinedTable reports whether err is PostgreSQL's undefined_table.
func isUndefinedTable(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "42P01"
}
