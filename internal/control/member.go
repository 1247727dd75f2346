package control

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/committed"
	"github.com/idemhq/idem/internal/pglead"
)

// Watcher keeps a member's copy of its group's controls: it LISTENs on the
// schema's channel on a connection of its own (taken out of Pool for good)
// and reads the group's state again at every notification for the group,
// every Reread (a notification lost with a dropped connection, a trigger
// someone removed), and after every reconnection. A read that fails ends
// the connection; the next one is tried after a backoff. Apply gets every
// state read, in order, from Run's goroutine; until the first, the member
// knows nothing (and handles nothing: see consumer's controls).
type Watcher struct {
	Pool  *pgxpool.Pool
	Group string
	// Reread is how often the state is read without a notification.
	// Default: 30s.
	Reread time.Duration
	// Retry is the first reconnection backoff, RetryMax its ceiling, and
	// Timeout bounds each statement. Defaults: 500ms, 15s, 15s.
	Retry, RetryMax, Timeout time.Duration
	Log                      *slog.Logger
	Apply                    func(State)
}

func (w *Watcher) defaults() {
	if w.Reread <= 0 {
		w.Reread = 30 * time.Second
	}
	if w.Retry <= 0 {
		w.Retry = 500 * time.Millisecond
	}
	if w.RetryMax <= 0 {
		w.RetryMax = 15 * time.Second
	}
	if w.Timeout <= 0 {
		w.Timeout = 15 * time.Second
	}
	if w.Log == nil {
		w.Log = slog.Default()
	}
}

// Run watches until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	w.defaults()
	for n := 1; ctx.Err() == nil; n++ {
		connected, err := w.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if connected {
			n = 1
		}
		wait := pglead.Backoff(n, w.Retry, w.RetryMax)
		w.Log.Warn("idem: live controls: lost the database; keeping the last state read and reconnecting", "err", err, "in", wait)
		pglead.Sleep(ctx, wait)
	}
}

// session is one connection's watch: it reports whether it read the state
// at least once, and why it ended (nil when ctx ended).
func (w *Watcher) session(ctx context.Context) (bool, error) {
	conn, release, err := pglead.Conn(ctx, w.Pool)
	if err != nil {
		return false, err
	}
	defer release()
	qctx, cancel := context.WithTimeout(ctx, w.Timeout)
	ch, err := Channel(qctx, conn)
	if err == nil {
		_, err = conn.Exec(qctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
	}
	cancel()
	if err != nil {
		return false, err
	}
	read := func() error {
		qctx, cancel := context.WithTimeout(ctx, w.Timeout)
		defer cancel()
		s, err := Load(qctx, conn, w.Group)
		if err != nil {
			return err
		}
		w.Apply(s)
		return nil
	}
	if err := read(); err != nil {
		return false, err
	}
	for {
		if err := w.wait(ctx, conn); err != nil || ctx.Err() != nil {
			return true, err
		}
		if err := read(); err != nil {
			return true, err
		}
	}
}

// wait returns when a notification for the group arrives, Reread passes,
// or ctx ends; only a failed connection is an error.
func (w *Watcher) wait(ctx context.Context, conn *pgx.Conn) error {
	wctx, cancel := context.WithTimeout(ctx, w.Reread)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(wctx)
		switch {
		case err != nil && wctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("wait for notification: %w", err)
		case n.Payload == w.Group:
			return nil
		}
	}
}

// Progress records that every record of re-drive id's part of partition
// below next reached its outcome, by member; it never moves back. It
// reports whether that ended the part; when it ended the last part, the
// re-drive is done.
func Progress(ctx context.Context, db DB, id int64, partition int32, next int64, member string) (bool, error) {
	var done bool
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		// The re-drive's row first: the parts of one re-drive end one at a
		// time, so the last one's end sees every other's and ends it.
		if _, err := tx.Exec(ctx, `SELECT 1 FROM idem_control_redrives WHERE id = $1 FOR UPDATE`, id); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `UPDATE idem_control_redrive_parts SET next_offset = greatest(next_offset, least($3, end_offset)),
				member = $4, updated_at = now(),
				done_at = CASE WHEN greatest(next_offset, least($3, end_offset)) >= end_offset THEN coalesce(done_at, now()) END
			WHERE redrive_id = $1 AND "partition" = $2 RETURNING done_at IS NOT NULL`, id, partition, next, member).Scan(&done)
		if err != nil {
			return err
		}
		if !done {
			return nil
		}
		_, err = tx.Exec(ctx, `UPDATE idem_control_redrives SET state = 'done', finished_at = now()
			WHERE id = $1 AND state = 'running' AND NOT EXISTS (SELECT 1 FROM idem_control_redrive_parts WHERE redrive_id = $1 AND done_at IS NULL)`, id)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("control: progress of re-drive %d, partition %d: %w", id, partition, err)
	}
	return done, nil
}

// PartOf reads re-drive id's part of partition as it stands, with the
// re-drive's state: where a member (re)starts it.
func PartOf(ctx context.Context, db DB, id int64, partition int32) (Part, string, error) {
	var p Part
	var state string
	err := db.QueryRow(ctx, `SELECT p."partition", p.start_offset, p.end_offset, p.next_offset, p.member, p.updated_at, p.done_at IS NOT NULL, r.state
		FROM idem_control_redrive_parts p JOIN idem_control_redrives r ON r.id = p.redrive_id
		WHERE p.redrive_id = $1 AND p."partition" = $2`, id, partition).Scan(&p.Partition, &p.Start, &p.End, &p.Next, &p.Member, &p.UpdatedAt, &p.Done, &state)
	if err != nil {
		return p, "", fmt.Errorf("control: re-drive %d, partition %d: %w", id, partition, err)
	}
	return p, state, nil
}

// ReadWindow calls fn for each record of topic/partition in [from, end)
// that a read_committed consumer gets (commit markers and aborted records
// skipped), in order, reading straight from the partition's leader
// (internal/committed). Records below the log start offset (deleted by
// retention since the window was fixed) are skipped. It returns fn's error,
// ctx's, or an error when the partition does not move for a minute.
func ReadWindow(ctx context.Context, client sarama.Client, topic string, partition int32, from, end int64, fn func(*sarama.ConsumerMessage) error) error {
	first, err := client.GetOffset(topic, partition, sarama.OffsetOldest)
	if err != nil {
		return fmt.Errorf("control: log start of %s/%d: %w", topic, partition, err)
	}
	return committed.Read(ctx, client, topic, partition, max(from, first), end, time.Minute, fn)
}

// StaleBeats is how many beats a member may miss before the fleet shows it
// as stale.
const StaleBeats = 3

// Member is one running consumer.Run of a group, as its heartbeat row
// says.
type Member struct {
	Group string `json:"group"`
	// ID is the member's own id: host, process and a random part, new at
	// each start of Run.
	ID          string    `json:"member"`
	InstanceID  string    `json:"instance_id"`  // Config.InstanceID ("": dynamic membership)
	KafkaMember string    `json:"kafka_member"` // the group coordinator's member id
	Host        string    `json:"host"`
	Version     string    `json:"version"`
	StartedAt   time.Time `json:"started_at"`
	BeatAt      time.Time `json:"beat_at"`
	// BeatEvery is how often the member beats.
	BeatEvery time.Duration `json:"beat_every"`
	Status    Status        `json:"status"`
	// MissedBeats counts the beats missed since BeatAt (by the database's
	// clock), and Stale says it is StaleBeats or more: the member died, or
	// lost its database.
	MissedBeats int  `json:"missed_beats"`
	Stale       bool `json:"stale"`
}

// Status is what a member reports in each beat.
type Status struct {
	Partitions []PartitionStatus `json:"partitions"`
	// Breaker is the dependency breaker that paused every partition of the
	// member, if one did.
	Breaker *BreakerStatus `json:"breaker,omitempty"`
}

// PartitionStatus is one claimed partition.
type PartitionStatus struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Lag is the records fetched by the claim but not taken yet plus those
	// not fetched yet (its high-water mark minus the next offset to take);
	// -1: not known yet.
	Lag int64 `json:"lag"`
	// Paused lists why its fetching is paused: operator, redrive, breaker,
	// backpressure.
	Paused []string `json:"paused,omitempty"`
	// Redrive is the re-drive the member runs on it (0: none).
	Redrive int64 `json:"redrive,omitempty"`
}

// BreakerStatus is an open dependency breaker.
type BreakerStatus struct {
	Name  string    `json:"name"`
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
}

// Beat writes m's heartbeat row (beat_at is the database's now) and
// deletes the group's rows whose last beat is over an hour old.
func Beat(ctx context.Context, db DB, m Member) error {
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO idem_control_members (consumer_group, member, instance_id, kafka_member, host, version, started_at, beat_every_ms, status)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (consumer_group, member) DO UPDATE SET instance_id = $3, kafka_member = $4, host = $5, version = $6,
			beat_at = now(), beat_every_ms = $8, status = $9`,
		m.Group, m.ID, m.InstanceID, m.KafkaMember, m.Host, m.Version, m.StartedAt, max(m.BeatEvery.Milliseconds(), 1), m.Status)
	b.Queue(`DELETE FROM idem_control_members WHERE consumer_group = $1 AND beat_at < now() - interval '1 hour'`, m.Group)
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("control: heartbeat: %w", err)
	}
	return nil
}

// Leave deletes member's heartbeat row: it stopped.
func Leave(ctx context.Context, db DB, group, member string) error {
	if _, err := db.Exec(ctx, `DELETE FROM idem_control_members WHERE consumer_group = $1 AND member = $2`, group, member); err != nil {
		return fmt.Errorf("control: leave: %w", err)
	}
	return nil
}

// Fleet returns the members of group ("": of every group), by group, then
// host and member.
func Fleet(ctx context.Context, db DB, group string) ([]Member, error) {
	rows, err := db.Query(ctx, `SELECT consumer_group, member, instance_id, kafka_member, host, version, started_at, beat_at, beat_every_ms, status,
			floor(extract(epoch FROM now() - beat_at) * 1000 / beat_every_ms)::int
		FROM idem_control_members WHERE $1 = '' OR consumer_group = $1 ORDER BY consumer_group, host, member`, group)
	if err != nil {
		return nil, fmt.Errorf("control: read the fleet: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Member, error) {
		var m Member
		var every int64
		err := r.Scan(&m.Group, &m.ID, &m.InstanceID, &m.KafkaMember, &m.Host, &m.Version, &m.StartedAt, &m.BeatAt, &every, &m.Status, &m.MissedBeats)
		m.BeatEvery = time.Duration(every) * time.Millisecond
		m.MissedBeats = max(m.MissedBeats, 0)
		m.Stale = m.MissedBeats >= StaleBeats
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("control: read the fleet: %w", err)
	}
	return out, nil
}

// Unwatched returns a warning when no fresh member of group reports to the
// fleet ("" when one does, or when the fleet cannot be read): a pause or a
// re-drive is then obeyed by no one until members with Config.Controls
// run.
func (a Admin) Unwatched(ctx context.Context, group string) string {
	ms, err := Fleet(ctx, a.DB, group)
	if err != nil {
		return ""
	}
	for _, m := range ms {
		if !m.Stale {
			return ""
		}
	}
	return fmt.Sprintf("no running member of group %s reports to the fleet: this takes effect when members run with consumer.Config.Controls (they read it at their start)", group)
}

// Fleet is the package's Fleet on a.DB.
func (a Admin) Fleet(ctx context.Context, group string) ([]Member, error) {
	return Fleet(ctx, a.DB, group)
}
