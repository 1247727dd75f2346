package failidx

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/forward"
)

// StartReplay claims the selected unresolved records for a replay job
// (sending nothing) and returns the job, owned by a. RunJob then publishes.
// Records that are not unresolved, stubs and records another action
// claimed first are skipped. Every check of Replay happens first, and a
// refused replay claims nothing and is audited.
func (a *Actions) StartReplay(ctx context.Context, actor string, sel Selection, to string, ratePerSec int, reason string) (Job, error) {
	var res Result
	if err := checkActor(actor); err != nil {
		return Job{}, err
	}
	to = strings.TrimSpace(to)
	if to == forward.ReplayToSource {
		to = ""
	}
	detail := sel.detail() + " to " + orOrigin(to)
	if ratePerSec > 0 {
		detail += fmt.Sprintf(" rate %d/s", ratePerSec)
	}
	fail := func(ids []int64, err error) (Job, error) {
		return Job{}, a.audit(ctx, actor, "replay", ids, detail, reason, res, err, "replayed")
	}
	if ratePerSec < 0 {
		return fail(sel.IDs, invalid("rate", "%d: must be >= 0", ratePerSec))
	}
	if a.client == nil {
		return fail(sel.IDs, errNoClient)
	}
	ids, err := a.resolve(ctx, sel)
	if err != nil {
		return fail(sel.IDs, err)
	}
	res.Matched = len(ids)
	rows, err := a.store.db.Query(ctx, `SELECT id, stub, status, origin_topic, consumer_group FROM idem_dlq_records WHERE id = ANY($1) ORDER BY id`, ids)
	if err != nil {
		return fail(ids, fmt.Errorf("index: replay: %w", err))
	}
	type candidate struct {
		id            int64
		stub          bool
		status        Status
		origin, group string
	}
	cands, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (candidate, error) {
		var c candidate
		err := row.Scan(&c.id, &c.stub, &c.status, &c.origin, &c.group)
		return c, err
	})
	if err != nil {
		return fail(ids, fmt.Errorf("index: replay: %w", err))
	}
	var stubs []int64
	dests := map[string]bool{}
	listed := false
	for _, c := range cands {
		switch {
		case c.stub:
			stubs = append(stubs, c.id)
		case c.status != Unresolved:
		default:
			if to == "" && c.origin == "" {
				return fail(ids, invalid("to", "record %d has no origin topic (no idem-original-topic): name a destination", c.id))
			}
			l, err := forward.CheckReplayTarget(c.origin, c.group, to, a.ReplayTopics)
			if err != nil {
				return fail(ids, invalid("to", "record %d: %v", c.id, err))
			}
			listed = listed || l
			if to == "" {
				dests[c.origin] = true
			}
		}
	}
	if listed {
		detail += " (allowed by --replay-topic)"
	}
	if len(dests) > 0 || to != "" {
		if to != "" {
			dests[to] = true
		}
		dc := dlq.New(a.client)
		for _, d := range slices.Sorted(mapKeys(dests)) {
			if err := dc.CheckTopic(d); err != nil {
				return fail(ids, fmt.Errorf("index: replay to %s: nothing published: %w", d, err))
			}
		}
	}
	var j Job
	err = pgx.BeginFunc(ctx, a.store.db, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO idem_dlq_jobs (action, actor, reason, detail, to_topic, rate, record_ids, matched,
			skipped_stubs, owner, heartbeat_at) VALUES ('replay', $1, $2, $3, $4, $5, $6, $7, $8, $9, now()) RETURNING id`,
			clean(actor), clean(reason), clean(detail), to, ratePerSec, ids, len(ids), nonNil(stubs), a.owner).Scan(&id); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `UPDATE idem_dlq_records SET status = 'replaying', job_id = $2, status_actor = $3, status_reason = $4,
			status_at = now(), publish_topic = NULL, publish_partition = NULL, publish_from = NULL
			WHERE id = ANY($1) AND status = 'unresolved' AND NOT stub RETURNING id`, ids, id, clean(actor), clean(reason))
		if err != nil {
			return err
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		j, err = scanJob(tx.QueryRow(ctx, `UPDATE idem_dlq_jobs SET claimed = $2, skipped = $3 WHERE id = $1 RETURNING `+jobCols,
			id, len(got), len(ids)-len(got)))
		return err
	})
	if err != nil {
		return fail(ids, fmt.Errorf("index: replay: claim: %w", err))
	}
	return j, nil
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// ReplayPlan is what a replay of a selection would do, counted in the
// database without reading a value: a dry run.
type ReplayPlan struct {
	// Selected counts the records the selection picks; Send those a replay
	// would send (unresolved, not stubs); Other those not unresolved; Stubs
	// the stubs (never replayed), the first ten of them in StubIDs.
	Selected, Send, Other, Stubs int
	StubIDs                      []int64
}

// PlanReplay counts what Replay with the same selection and destination
// would do, and makes the same checks of the destination (a target that is
// neither the origin nor one of its group's tiers nor in ReplayTopics is a
// *ValidationError on "to"; a topic that does not exist wraps
// dlq.ErrUnknownTopic), sending and changing nothing. It reads no value,
// however many records the selection picks.
func (a *Actions) PlanReplay(ctx context.Context, sel Selection, to string) (ReplayPlan, error) {
	var p ReplayPlan
	to = strings.TrimSpace(to)
	if to == forward.ReplayToSource {
		to = ""
	}
	var args []any
	cond := ""
	switch {
	case len(sel.IDs) > 0 && sel.Filter != nil:
		return p, invalid("selection", "give ids or a filter, not both")
	case len(sel.IDs) > 0:
		if _, err := a.resolve(ctx, sel); err != nil { // every id must exist
			return p, err
		}
		args, cond = []any{sel.IDs}, "id = ANY($1)"
	case sel.Filter != nil:
		var err error
		if cond, err = sel.Filter.where(&args); err != nil {
			return p, err
		}
	default:
		return p, invalid("selection", "empty: give record ids or a filter")
	}
	err := a.store.db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'unresolved' AND NOT stub),
		count(*) FILTER (WHERE status <> 'unresolved' AND NOT stub), count(*) FILTER (WHERE stub),
		coalesce((array_agg(id ORDER BY id) FILTER (WHERE stub))[1:10], '{}')
		FROM idem_dlq_records WHERE `+cond, args...).Scan(&p.Selected, &p.Send, &p.Other, &p.Stubs, &p.StubIDs)
	if err != nil {
		return p, fmt.Errorf("index: plan a replay: %w", err)
	}
	rows, err := a.store.db.Query(ctx, `SELECT DISTINCT origin_topic, consumer_group FROM idem_dlq_records
		WHERE status = 'unresolved' AND NOT stub AND `+cond, args...)
	if err != nil {
		return p, fmt.Errorf("index: plan a replay: %w", err)
	}
	pairs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var x [2]string
		err := r.Scan(&x[0], &x[1])
		return x, err
	})
	if err != nil {
		return p, fmt.Errorf("index: plan a replay: %w", err)
	}
	dests := map[string]bool{}
	for _, og := range pairs {
		if to == "" && og[0] == "" {
			return p, invalid("to", "a selected record has no origin topic (no idem-original-topic): name a destination")
		}
		if _, err := forward.CheckReplayTarget(og[0], og[1], to, a.ReplayTopics); err != nil {
			return p, invalid("to", "%v", err)
		}
		if to == "" {
			dests[og[0]] = true
		}
	}
	if to != "" && len(pairs) > 0 {
		dests[to] = true
	}
	if len(dests) > 0 {
		if a.client == nil {
			return p, errNoClient
		}
		dc := dlq.New(a.client)
		for _, d := range slices.Sorted(mapKeys(dests)) {
			if err := dc.CheckTopic(d); err != nil {
				return p, fmt.Errorf("index: replay to %s: %w", d, err)
			}
		}
	}
	return p, nil
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
		return forward.ReplayToSource
	}
	return to
}
