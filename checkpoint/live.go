package checkpoint

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/idemhq/idem/internal/configerr"
	"github.com/jackc/pgx/v5"
)

// LiveTable reads a table that is written while the job runs (an events
// table, an append-only log) in an order that never skips a row, whatever
// order its writers commit in. Its Read method is a Job.Read.
//
// Why "WHERE id > cursor" is not enough on such a table: ids are drawn at
// INSERT, not at COMMIT. A transaction may hold id 5 while id 6 is already
// committed; a chunk that reads id 6 moves the cursor past 5, and when 5
// commits it is never read. The plain id cursor is correct only when no
// transaction that inserts rows into the table runs at the same time as the
// job (a table filled before the job starts, a closed partition).
//
// LiveTable reads instead in the order of the inserting transaction's id
// (xid8), then the row's id, and only rows of transactions older than the
// snapshot's xmin (pg_snapshot_xmin(pg_current_snapshot())): every such
// transaction has ended, and every transaction still running or yet to come
// has a larger xid8, so its rows sort after the cursor. The price: a row is
// read only once every transaction that started before its own has ended, so
// one long transaction anywhere in the database holds the job back for its
// length (the job waits; it never skips).
//
// The table needs a column holding the inserting transaction's id, and an
// index for the read:
//
//	ALTER TABLE events ADD COLUMN xact xid8 NOT NULL DEFAULT pg_current_xact_id();
//	CREATE INDEX ON events (xact, id);
//
// Rows that existed before the column was added get the ALTER's own xid8;
// rows that are later UPDATEd keep their place. The cursor is the text
// "<xact>/<id>" of the last row read.
type LiveTable[R any] struct {
	// Table is the table, "table" or "schema.table". Required.
	Table string
	// Columns is the select list Dest scans, as SQL ("id, amount"). Required.
	Columns string
	// Dest returns the scan destinations of one row, in Columns' order.
	// Required.
	Dest func(r *R) []any
	// Where, when not empty, is an extra SQL condition on the rows ("kind =
	// 'payment'"), without parameters.
	Where string
	// ID is the row id column, a bigint unique within a transaction.
	// Default: "id".
	ID string
	// Xact is the xid8 column holding the inserting transaction's id.
	// Default: "xact".
	Xact string
}

// Read is a Job.Read: up to limit rows after the cursor after, in (xact,
// id) order, of transactions that have all ended (see LiveTable).
func (l LiveTable[R]) Read(ctx context.Context, tx pgx.Tx, after string, limit int) ([]R, string, error) {
	if err := l.validate(); err != nil {
		return nil, "", err
	}
	l = l.withDefaults()
	xact, id := "0", int64(0)
	if after != "" {
		x, i, ok := strings.Cut(after, "/")
		n, err := strconv.ParseInt(i, 10, 64)
		if _, xerr := strconv.ParseUint(x, 10, 64); !ok || err != nil || xerr != nil {
			return nil, "", fmt.Errorf("checkpoint: cursor %q is not a LiveTable cursor (\"<xact>/<id>\")", after)
		}
		xact, id = x, n
	}
	idCol, xactCol := pgx.Identifier{l.ID}.Sanitize(), pgx.Identifier{l.Xact}.Sanitize()
	where := ""
	if l.Where != "" {
		where = " AND (" + l.Where + ")"
	}
	rows, err := tx.Query(ctx, `SELECT `+l.Columns+`, `+xactCol+`::text, `+idCol+
		` FROM `+pgx.Identifier(strings.Split(l.Table, ".")).Sanitize()+
		` WHERE (`+xactCol+`, `+idCol+`) > ($1::text::xid8, $2::bigint)`+
		` AND `+xactCol+` < pg_snapshot_xmin(pg_current_snapshot())`+where+
		` ORDER BY `+xactCol+`, `+idCol+` LIMIT $3`, xact, id, limit)
	if err != nil {
		return nil, "", fmt.Errorf("checkpoint: read %s: %w", l.Table, err)
	}
	defer rows.Close()
	var out []R
	last := after
	for rows.Next() {
		var r R
		var x string
		var i int64
		if err := rows.Scan(append(l.Dest(&r), &x, &i)...); err != nil {
			return nil, "", fmt.Errorf("checkpoint: read %s: %w", l.Table, err)
		}
		out = append(out, r)
		last = x + "/" + strconv.FormatInt(i, 10)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("checkpoint: read %s: %w", l.Table, err)
	}
	return out, last, nil
}

// withDefaults returns l with every zero field set to its default: the one
// place LiveTable's defaults live.
func (l LiveTable[R]) withDefaults() LiveTable[R] {
	if l.ID == "" {
		l.ID = "id"
	}
	if l.Xact == "" {
		l.Xact = "xact"
	}
	return l
}

// validate reports every missing required field of l at once, each a
// problem of the job (errInvalidJob).
func (l LiveTable[R]) validate() error {
	e := configerr.New(errInvalidJob, "LiveTable.")
	if l.Table == "" {
		e.Bad("Table", l.Table, "required")
	}
	if l.Columns == "" {
		e.Bad("Columns", l.Columns, "required")
	}
	if l.Dest == nil {
		e.Bad("Dest", nil, "required")
	}
	return e.Err()
}
