package control

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/internal/failidx"
)

// The errors of the admin calls. Each is wrapped with what was refused.
var (
	// ErrNotFound: no re-drive has that id.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the thing is in another state already (paused, not
	// paused, a re-drive of the topic running, a re-drive ended).
	ErrConflict = errors.New("conflict")
	// ErrRateLimited: the group had MaxRedrivesPerHour re-drives in the
	// last hour; the error is a *RateError.
	ErrRateLimited = errors.New("too many re-drives")
)

// InputError is bad input to an admin call: nothing was changed.
type InputError struct {
	Field string // the input at fault: group, topic, partition, from, …
	Msg   string
}

func (e *InputError) Error() string { return e.Field + ": " + e.Msg }

func invalid(field, format string, args ...any) error {
	return &InputError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// RateError is a re-drive refused by the rate limit; it wraps
// ErrRateLimited.
type RateError struct {
	Group      string
	Max        int
	RetryAfter time.Duration // when the oldest re-drive of the hour leaves it
}

func (e *RateError) Error() string {
	return fmt.Sprintf("%s: group %s had %d re-drives in the last hour (at most %d); the next one is allowed in %s",
		ErrRateLimited, e.Group, e.Max, e.Max, e.RetryAfter.Round(time.Second))
}

func (e *RateError) Unwrap() error { return ErrRateLimited }

// DefaultMaxRedrivesPerHour is Admin.MaxRedrivesPerHour's default.
const DefaultMaxRedrivesPerHour = 6

// Admin makes the operator's changes: pause, resume, re-drive, cancel.
// Each claims what it changes in the statement that changes it (a second
// click, a second operator, the CLI beside the console: one of them acts,
// the others get ErrConflict) and writes its audit row (idem_dlq_audit) in
// the same transaction.
type Admin struct {
	DB DB
	// MaxRedrivesPerHour bounds the re-drives of one group started in any
	// hour (cancelled ones count). Default (0): DefaultMaxRedrivesPerHour.
	MaxRedrivesPerHour int
}

func (a Admin) maxPerHour() int {
	if a.MaxRedrivesPerHour <= 0 {
		return DefaultMaxRedrivesPerHour
	}
	return a.MaxRedrivesPerHour
}

// inTx runs fn in a transaction of a.DB, committed when fn returns nil.
func (a Admin) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	if a.DB == nil {
		return errors.New("control: no database")
	}
	return pgx.BeginFunc(ctx, a.DB, fn)
}

func checkTarget(group, topic string, partition int32) error {
	switch {
	case strings.TrimSpace(group) == "":
		return invalid("group", "empty: name the consumer group")
	case strings.TrimSpace(topic) == "":
		return invalid("topic", "empty: name the topic")
	case partition < AllPartitions:
		return invalid("partition", "%d: want a partition number, or none for the whole topic", partition)
	}
	return nil
}

func audit(ctx context.Context, tx pgx.Tx, actor, action, detail, reason, result string) error {
	return failidx.WriteAuditTx(ctx, tx, failidx.AuditEntry{Actor: actor, Action: action, Detail: detail, Reason: reason, Result: result})
}

// pauseDetail is a pause's audit detail: "group g, payments/3".
func pauseDetail(p Pause) string { return "group " + p.Group + ", " + p.What() }

// Pause pauses p.Topic (p.Partition AllPartitions) or one partition of it
// for p.Group, by actor, with p.Reason (required). A pause that exists
// already is ErrConflict, naming who paused it and when.
func (a Admin) Pause(ctx context.Context, actor string, p Pause) (Pause, error) {
	p.Reason = strings.TrimSpace(p.Reason)
	if err := checkTarget(p.Group, p.Topic, p.Partition); err != nil {
		return p, err
	}
	if p.Reason == "" {
		return p, invalid("reason", "empty: say why the partition is paused (it is kept with the pause and in the audit log)")
	}
	p.By = actor
	err := a.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO idem_control_pauses (consumer_group, topic, "partition", paused_by, reason)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING paused_at`,
			p.Group, p.Topic, p.Partition, actor, p.Reason).Scan(&p.At)
		if errors.Is(err, pgx.ErrNoRows) {
			var by string
			var at time.Time
			if err := tx.QueryRow(ctx, `SELECT paused_by, paused_at FROM idem_control_pauses WHERE consumer_group = $1 AND topic = $2 AND "partition" = $3`,
				p.Group, p.Topic, p.Partition).Scan(&by, &at); err != nil {
				return fmt.Errorf("control: pause: %w", err)
			}
			return fmt.Errorf("%w: %s is paused already (by %s at %s)", ErrConflict, pauseDetail(p), by, at.UTC().Format(time.RFC3339))
		}
		if err != nil {
			return fmt.Errorf("control: pause: %w", err)
		}
		return audit(ctx, tx, actor, "pause", pauseDetail(p), p.Reason, "ok: paused")
	})
	return p, err
}

// Resume ends the pause of p.Topic (p.Partition AllPartitions) or of one
// partition of it for p.Group, by actor; p.Reason is optional. It returns
// the pause it ended; none is ErrConflict. A partition's resume leaves its
// topic's pause, if any, in place (and the other way round): the caller
// says so.
func (a Admin) Resume(ctx context.Context, actor string, p Pause) (Pause, error) {
	reason := strings.TrimSpace(p.Reason)
	if err := checkTarget(p.Group, p.Topic, p.Partition); err != nil {
		return p, err
	}
	err := a.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `DELETE FROM idem_control_pauses WHERE consumer_group = $1 AND topic = $2 AND "partition" = $3
			RETURNING paused_by, reason, paused_at`, p.Group, p.Topic, p.Partition).Scan(&p.By, &p.Reason, &p.At)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %s is not paused", ErrConflict, pauseDetail(p))
		}
		if err != nil {
			return fmt.Errorf("control: resume: %w", err)
		}
		return audit(ctx, tx, actor, "resume", pauseDetail(p), reason,
			fmt.Sprintf("ok: resumed (paused by %s at %s)", p.By, p.At.UTC().Format(time.RFC3339)))
	})
	return p, err
}

// Pauses returns the pauses of group ("": of every group).
func (a Admin) Pauses(ctx context.Context, group string) ([]Pause, error) {
	return pauses(ctx, a.DB, group)
}

// RedriveRequest asks for a re-drive of Group's records of Topic.
type RedriveRequest struct {
	Group, Topic string
	// Partition is the one partition to re-drive, or AllPartitions.
	Partition int32
	// From is the window's start: the first record whose timestamp is at or
	// after it, in each partition. Or FromOffset (>= 0, with one
	// Partition): that offset. Exactly one of the two.
	From       time.Time
	FromOffset int64
	// Until is the window's end (exclusive): the first record whose
	// timestamp is at or after it. Zero: the partition's end (its last
	// stable offset) at the request.
	Until time.Time
	// Epoch reuses an earlier re-drive's epoch of the group (its keys are
	// then handled at most once more in it: a second re-drive with one
	// epoch does nothing to what the first did); 0 takes a new one.
	Epoch int64
	// Rate caps the re-drive at this many records a second per partition;
	// 0: no cap.
	Rate int
	// Reason is required; it is kept with the re-drive and audited.
	Reason string
}

// Check validates r's own fields (not the topic's existence).
func (r RedriveRequest) Check() error {
	if err := r.checkWindow(); err != nil {
		return err
	}
	if strings.TrimSpace(r.Reason) == "" {
		return invalid("reason", "empty: say why the window is re-driven")
	}
	return nil
}

// checkWindow is Check without the reason (a dry run needs none).
func (r RedriveRequest) checkWindow() error {
	if err := checkTarget(r.Group, r.Topic, r.Partition); err != nil {
		return err
	}
	switch {
	case r.From.IsZero() && r.FromOffset < 0:
		return invalid("from", "give the window's start: a time, or an offset with a partition")
	case !r.From.IsZero() && r.FromOffset >= 0:
		return invalid("from", "give a start time or a start offset, not both")
	case r.FromOffset >= 0 && r.Partition == AllPartitions:
		return invalid("partition", "a start offset needs a partition (offsets are per partition)")
	case !r.Until.IsZero() && !r.From.IsZero() && !r.Until.After(r.From):
		return invalid("until", "%s is not after from %s", r.Until.Format(time.RFC3339), r.From.Format(time.RFC3339))
	case r.Epoch < 0:
		return invalid("epoch", "%d: want an earlier re-drive's epoch, or none for a new one", r.Epoch)
	case r.Rate < 0:
		return invalid("rate", "%d: want records a second, or 0 for no cap", r.Rate)
	}
	return nil
}

// lockGroup serialises the re-drive requests of group (epochs, the rate).
func lockGroup(ctx context.Context, tx pgx.Tx, group string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('idem_control_redrive:' || $1, 0))`, group)
	return err
}

// admit checks, in tx under the group's lock, that r may start now, and
// returns its epoch: the rate limit, no re-drive of the topic running, an
// epoch that exists when one is named.
func (a Admin) admit(ctx context.Context, tx pgx.Tx, r RedriveRequest) (int64, error) {
	if err := lockGroup(ctx, tx, r.Group); err != nil {
		return 0, fmt.Errorf("control: re-drive: %w", err)
	}
	var n int
	var wait float64
	if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM min(created_at) + interval '1 hour' - now()), 0)::float8
		FROM idem_control_redrives WHERE consumer_group = $1 AND created_at > now() - interval '1 hour'`, r.Group).Scan(&n, &wait); err != nil {
		return 0, fmt.Errorf("control: re-drive: %w", err)
	}
	if n >= a.maxPerHour() {
		return 0, &RateError{Group: r.Group, Max: a.maxPerHour(), RetryAfter: time.Duration(max(wait, 1) * float64(time.Second))}
	}
	var running int64
	var by string
	err := tx.QueryRow(ctx, `SELECT id, requested_by FROM idem_control_redrives WHERE consumer_group = $1 AND topic = $2 AND state = 'running'`,
		r.Group, r.Topic).Scan(&running, &by)
	switch {
	case err == nil:
		return 0, fmt.Errorf("%w: re-drive %d of %s for group %s (by %s) is running: wait for it or cancel it", ErrConflict, running, r.Topic, r.Group, by)
	case !errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("control: re-drive: %w", err)
	}
	var top int64
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(epoch), 0) FROM idem_control_redrives WHERE consumer_group = $1`, r.Group).Scan(&top); err != nil {
		return 0, fmt.Errorf("control: re-drive: %w", err)
	}
	switch {
	case r.Epoch == 0:
		return top + 1, nil
	case r.Epoch > top:
		return 0, invalid("epoch", "group %s has no epoch %d yet (the highest is %d): leave it out for a new one", r.Group, r.Epoch, top)
	}
	return r.Epoch, nil
}

// Plan is what a re-drive would do, without doing it: the checks of
// StartRedrive (rate, a running re-drive, the epoch) and the window parts
// give. It returns the re-drive as it would start (ID 0). It needs no
// reason, and writes nothing.
func (a Admin) Plan(ctx context.Context, actor string, r RedriveRequest, parts []Part) (Redrive, error) {
	if err := r.checkWindow(); err != nil {
		return Redrive{}, err
	}
	rd := newRedrive(actor, r, parts)
	err := a.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		rd.Epoch, err = a.admit(ctx, tx, r)
		return err
	})
	return rd, err
}

func newRedrive(actor string, r RedriveRequest, parts []Part) Redrive {
	for i := range parts {
		parts[i].Next = parts[i].Start
		parts[i].Done = parts[i].Start >= parts[i].End
	}
	return Redrive{Group: r.Group, Topic: r.Topic, State: Running, From: r.From, Until: r.Until, Rate: r.Rate,
		By: actor, Reason: strings.TrimSpace(r.Reason), Parts: parts}
}

// StartRedrive starts a re-drive of r over the window parts (from
// Window), by actor: it checks the rate limit (ErrRateLimited), that no
// re-drive of the topic runs for the group (ErrConflict), the epoch, and
// that the window holds something, then inserts it and its parts and
// audits it, in one transaction. The group's members take it up at once
// (the insert NOTIFYs them).
func (a Admin) StartRedrive(ctx context.Context, actor string, r RedriveRequest, parts []Part) (Redrive, error) {
	if err := r.Check(); err != nil {
		return Redrive{}, err
	}
	rd := newRedrive(actor, r, parts)
	if total, _ := rd.Offsets(); total == 0 {
		return rd, invalid("from", "the window holds no record of %s: nothing to re-drive", r.Topic)
	}
	err := a.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		if rd.Epoch, err = a.admit(ctx, tx, r); err != nil {
			return err
		}
		err = tx.QueryRow(ctx, `INSERT INTO idem_control_redrives (consumer_group, topic, epoch, from_time, until_time, rate, requested_by, reason)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id, created_at`,
			rd.Group, rd.Topic, rd.Epoch, nullTime(rd.From), nullTime(rd.Until), rd.Rate, actor, rd.Reason).Scan(&rd.ID, &rd.CreatedAt)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" { // the running index: another request won
			return fmt.Errorf("%w: a re-drive of %s for group %s is running", ErrConflict, rd.Topic, rd.Group)
		}
		if err != nil {
			return fmt.Errorf("control: re-drive: %w", err)
		}
		for _, p := range rd.Parts {
			if _, err := tx.Exec(ctx, `INSERT INTO idem_control_redrive_parts (redrive_id, "partition", start_offset, end_offset, next_offset, done_at)
				VALUES ($1, $2, $3::bigint, $4::bigint, $3::bigint, CASE WHEN $3::bigint >= $4::bigint THEN now() END)`, rd.ID, p.Partition, p.Start, p.End); err != nil {
				return fmt.Errorf("control: re-drive: part %d: %w", p.Partition, err)
			}
		}
		total, _ := rd.Offsets()
		return audit(ctx, tx, actor, "redrive", rd.Detail(), rd.Reason, fmt.Sprintf("ok: started, %d offsets", total))
	})
	return rd, err
}

// Detail describes r for the audit log and the CLI: "re-drive 7 of
// payments for group billing, epoch 3, from … until …: 0:10-250 1:12-240".
func (r Redrive) Detail() string {
	var b strings.Builder
	if r.ID > 0 {
		fmt.Fprintf(&b, "re-drive %d of ", r.ID)
	} else {
		b.WriteString("re-drive of ")
	}
	fmt.Fprintf(&b, "%s for group %s, epoch %d", r.Topic, r.Group, r.Epoch)
	if !r.From.IsZero() {
		b.WriteString(", from " + r.From.UTC().Format(time.RFC3339))
	}
	if !r.Until.IsZero() {
		b.WriteString(", until " + r.Until.UTC().Format(time.RFC3339))
	}
	if r.Rate > 0 {
		b.WriteString(", rate " + strconv.Itoa(r.Rate) + "/s")
	}
	b.WriteString(", offsets")
	for _, p := range r.Parts {
		fmt.Fprintf(&b, " %d:%d-%d", p.Partition, p.Start, p.End)
	}
	return b.String()
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// CancelRedrive stops re-drive id, by actor: the parts not done are left
// where they are, and the re-drive's window keeps its epoch (what it
// handled stays done in it). A re-drive that ended is ErrConflict.
func (a Admin) CancelRedrive(ctx context.Context, actor string, id int64, reason string) (Redrive, error) {
	var rd Redrive
	err := a.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE idem_control_redrives SET state = 'cancelled', finished_at = now(), finished_by = $2
			WHERE id = $1 AND state = 'running'`, id, actor)
		if err != nil {
			return fmt.Errorf("control: cancel re-drive %d: %w", id, err)
		}
		if rd, err = redriveByID(ctx, tx, id); err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("%w: re-drive %d is %s", ErrConflict, id, rd.State)
		}
		_, done := rd.Offsets()
		return audit(ctx, tx, actor, "redrive-cancel", rd.Detail(), strings.TrimSpace(reason), fmt.Sprintf("ok: cancelled after %d offsets", done))
	})
	return rd, err
}

func redriveByID(ctx context.Context, db DB, id int64) (Redrive, error) {
	rs, err := redrives(ctx, db, `WHERE r.id = $1`, id)
	if err != nil {
		return Redrive{}, err
	}
	if len(rs) == 0 {
		return Redrive{}, fmt.Errorf("%w: no re-drive %d", ErrNotFound, id)
	}
	return rs[0], nil
}

// Redrive returns re-drive id.
func (a Admin) Redrive(ctx context.Context, id int64) (Redrive, error) {
	return redriveByID(ctx, a.DB, id)
}

// RunningRedrives returns the re-drives running, of every group, oldest
// first.
func (a Admin) RunningRedrives(ctx context.Context) ([]Redrive, error) {
	return redrives(ctx, a.DB, `WHERE r.state = 'running' ORDER BY r.id`)
}

// Redrives returns the newest limit re-drives of group ("": every group),
// newest first.
func (a Admin) Redrives(ctx context.Context, group string, limit int) ([]Redrive, error) {
	if limit <= 0 {
		limit = 50
	}
	return redrives(ctx, a.DB, `WHERE $1 = '' OR r.consumer_group = $1 ORDER BY r.id DESC LIMIT $2`, group, limit)
}
