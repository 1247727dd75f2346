// Package control is idem's live controls, kept in PostgreSQL: the partitions an
// operator paused, the re-drives of a window of records under a replay
// epoch, and the heartbeats of the members of each consumer group (the
// fleet). The console and the CLI change them (admin.go: each change
// claimed in the statement that makes it, and audited in the same
// transaction); consumer.Run reads them (member.go: a Watcher LISTENs on the
// schema's channel and re-reads every Reread besides, the partition owner
// re-drives a window and records its progress, every member writes its
// heartbeat).
//
// The tables (migrations/0001_controls.sql, component "control"):
// idem_control_pauses, idem_control_redrives, idem_control_redrive_parts and
// idem_control_members. idem.Migrate creates them, and so does a consumer
// with Config.Controls at its start (with the failure index's tables: the
// changes are audited in idem_dlq_audit).
package control

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/internal/pgmigrate"
	"github.com/idemhq/idem/internal/tables"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate creates or upgrades the control tables (component "control"),
// and the failure index's (internal/tables), whose audit table
// (idem_dlq_audit) records every change of the controls.
func Migrate(ctx context.Context, db pgmigrate.DB) error {
	if err := tables.MigrateIndex(ctx, db); err != nil {
		return fmt.Errorf("control: migrate: %w", err)
	}
	if err := pgmigrate.LoadApply(ctx, db, "control", migrationFS, nil); err != nil {
		return fmt.Errorf("control: migrate: %w", err)
	}
	return nil
}

// DB is what the functions of this package need of a database handle;
// *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// AllPartitions is Pause.Partition for a pause of a whole topic.
const AllPartitions int32 = -1

// Pause is one operator pause: of a topic of a consumer group (Partition
// AllPartitions) or of one of its partitions.
type Pause struct {
	Group     string    `json:"group"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"` // AllPartitions: every partition
	By        string    `json:"paused_by"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"paused_at"`
}

// Covers reports whether p pauses partition of topic.
func (p Pause) Covers(topic string, partition int32) bool {
	return p.Topic == topic && (p.Partition == AllPartitions || p.Partition == partition)
}

// What names what p pauses: "payments/3", or "payments (every partition)".
func (p Pause) What() string {
	if p.Partition == AllPartitions {
		return p.Topic + " (every partition)"
	}
	return p.Topic + "/" + strconv.Itoa(int(p.Partition))
}

// Redrive states.
const (
	Running   = "running"
	Done      = "done"
	Cancelled = "cancelled"
)

// Redrive is one re-drive: a group's records of a topic read again, each
// under Epoch, from each part's start to its end.
type Redrive struct {
	ID         int64     `json:"id"`
	Group      string    `json:"group"`
	Topic      string    `json:"topic"`
	Epoch      int64     `json:"epoch"`
	State      string    `json:"state"`
	From       time.Time `json:"from,omitzero"`  // the window's start as asked (zero: by offset)
	Until      time.Time `json:"until,omitzero"` // the window's end as asked (zero: the end at the request)
	Rate       int       `json:"rate"`           // records a second per partition; 0: no cap
	By         string    `json:"requested_by"`
	Reason     string    `json:"reason"`
	CreatedAt  time.Time `json:"created_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	FinishedBy string    `json:"finished_by,omitempty"`
	Parts      []Part    `json:"parts"`
}

// Part is a re-drive's window in one partition and its progress.
type Part struct {
	Partition int32     `json:"partition"`
	Start     int64     `json:"start_offset"`
	End       int64     `json:"end_offset"` // exclusive
	Next      int64     `json:"next_offset"`
	Member    string    `json:"member,omitempty"` // the member that re-drives it, or did last
	UpdatedAt time.Time `json:"updated_at"`
	Done      bool      `json:"done"`
}

// Offsets is the number of offsets in the part's window.
func (p Part) Offsets() int64 { return p.End - p.Start }

// Contains reports whether offset lies in the part's window.
func (p Part) Contains(offset int64) bool { return p.Start <= offset && offset < p.End }

// Offsets is the number of offsets in the re-drive's window, and how many
// of them are behind it.
func (r Redrive) Offsets() (total, done int64) {
	for _, p := range r.Parts {
		total += p.Offsets()
		done += p.Next - p.Start
	}
	return total, done
}

// Part returns r's part of partition.
func (r Redrive) Part(partition int32) (Part, bool) {
	for _, p := range r.Parts {
		if p.Partition == partition {
			return p, true
		}
	}
	return Part{}, false
}

// State is what a member of a group obeys: its pauses and its re-drives
// (ended ones too, for EpochsKept: a record of a window keeps its epoch).
type State struct {
	Pauses   []Pause
	Redrives []Redrive

	// windows indexes the re-drives' windows by topic and partition, as
	// Load builds it (nil: Epoch scans Redrives).
	windows map[topicPartition][]span
}

type topicPartition struct {
	topic     string
	partition int32
}

// span is one re-drive's window in one partition.
type span struct {
	start, end, epoch int64
}

// index builds s.windows.
func (s *State) index() {
	s.windows = map[topicPartition][]span{}
	for _, r := range s.Redrives {
		for _, p := range r.Parts {
			k := topicPartition{r.Topic, p.Partition}
			s.windows[k] = append(s.windows[k], span{p.Start, p.End, r.Epoch})
		}
	}
}

// Paused returns the pause that holds partition of topic, if any (a
// partition's own before its topic's).
func (s State) Paused(topic string, partition int32) (Pause, bool) {
	var topicWide *Pause
	for i, p := range s.Pauses {
		if !p.Covers(topic, partition) {
			continue
		}
		if p.Partition == partition {
			return p, true
		}
		topicWide = &s.Pauses[i]
	}
	if topicWide != nil {
		return *topicWide, true
	}
	return Pause{}, false
}

// Epoch is the replay epoch of the record at offset of partition of topic:
// the highest epoch of the re-drives whose window holds it, 0 when none
// does. Every member computes it the same way from the same rows, for a
// record read from its topic, from a retry tier (by its origin) or from a
// re-drive, so a record is handled under one epoch however it comes.
func (s State) Epoch(topic string, partition int32, offset int64) int64 {
	var epoch int64
	if s.windows != nil { // Load's index: the partition's windows only
		for _, w := range s.windows[topicPartition{topic, partition}] {
			if w.start <= offset && offset < w.end && w.epoch > epoch {
				epoch = w.epoch
			}
		}
		return epoch
	}
	for _, r := range s.Redrives {
		if r.Topic != topic || r.Epoch <= epoch {
			continue
		}
		if p, ok := r.Part(partition); ok && p.Contains(offset) {
			epoch = r.Epoch
		}
	}
	return epoch
}

// Active returns the running re-drive of topic whose part of partition is
// not done yet, if any.
func (s State) Active(topic string, partition int32) (Redrive, Part, bool) {
	for _, r := range s.Redrives {
		if r.State != Running || r.Topic != topic {
			continue
		}
		if p, ok := r.Part(partition); ok && !p.Done {
			return r, p, true
		}
	}
	return Redrive{}, Part{}, false
}

// Running reports whether re-drive id is in s and running.
func (s State) Running(id int64) bool {
	for _, r := range s.Redrives {
		if r.ID == id {
			return r.State == Running
		}
	}
	return false
}

// EpochsKept is how long a re-drive's window keeps its epoch for the
// members after the re-drive started: longer than the inbox keeps a key
// (14 days by default), after which a record read again runs again
// whatever its epoch.
const EpochsKept = 30 * 24 * time.Hour

// Load reads the state of group: its pauses and its re-drives with their
// parts, oldest first (those started in the last EpochsKept, and any still
// running).
func Load(ctx context.Context, db DB, group string) (State, error) {
	var s State
	var err error
	if s.Pauses, err = pauses(ctx, db, group); err != nil {
		return s, err
	}
	if s.Redrives, err = redrives(ctx, db, `WHERE r.consumer_group = $1 AND (r.state = 'running' OR r.created_at > now() - $2::interval) ORDER BY r.id`,
		group, EpochsKept); err != nil {
		return s, err
	}
	s.index()
	return s, nil
}

// pauses reads the pauses of group ("": every group), by group, topic and
// partition.
func pauses(ctx context.Context, db DB, group string) ([]Pause, error) {
	rows, err := db.Query(ctx, `SELECT consumer_group, topic, "partition", paused_by, reason, paused_at
		FROM idem_control_pauses WHERE $1 = '' OR consumer_group = $1 ORDER BY 1, 2, 3`, group)
	if err != nil {
		return nil, fmt.Errorf("control: read pauses: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Pause, error) {
		var p Pause
		err := r.Scan(&p.Group, &p.Topic, &p.Partition, &p.By, &p.Reason, &p.At)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("control: read pauses: %w", err)
	}
	return out, nil
}

// redrives reads the re-drives a WHERE … ORDER BY … clause on alias r
// selects, with their parts.
func redrives(ctx context.Context, db DB, where string, args ...any) ([]Redrive, error) {
	rows, err := db.Query(ctx, `SELECT r.id, r.consumer_group, r.topic, r.epoch, r.state, r.from_time, r.until_time, r.rate,
		r.requested_by, r.reason, r.created_at, r.finished_at, r.finished_by,
		coalesce((SELECT json_agg(json_build_object('partition', p."partition", 'start_offset', p.start_offset,
			'end_offset', p.end_offset, 'next_offset', p.next_offset, 'member', p.member, 'updated_at', p.updated_at,
			'done', p.done_at IS NOT NULL) ORDER BY p."partition") FROM idem_control_redrive_parts p WHERE p.redrive_id = r.id), '[]')
		FROM idem_control_redrives r `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("control: read re-drives: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Redrive, error) {
		var r Redrive
		var from, until, finished *time.Time
		err := row.Scan(&r.ID, &r.Group, &r.Topic, &r.Epoch, &r.State, &from, &until, &r.Rate,
			&r.By, &r.Reason, &r.CreatedAt, &finished, &r.FinishedBy, &r.Parts)
		r.From, r.Until, r.FinishedAt = deref(from), deref(until), deref(finished)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("control: read re-drives: %w", err)
	}
	return out, nil
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// MissingTables reports whether err says the control tables do not exist
// (a database migrated before them, or by a part of idem only): run
// idem.Migrate or idem migrate.
func MissingTables(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01" && strings.Contains(pe.Message, "idem_control_")
}

// Channel returns the NOTIFY channel of the control tables db sees: one per
// schema, so that the tables of two schemas (two tests, two tenants) do not
// wake each other's members.
func Channel(ctx context.Context, db DB) (string, error) {
	var ch string
	err := db.QueryRow(ctx, `SELECT 'idem_control_' || relnamespace::text FROM pg_class WHERE oid = 'idem_control_pauses'::regclass`).Scan(&ch)
	if err != nil {
		return "", fmt.Errorf("control: find the channel: %w", err)
	}
	return ch, nil
}
