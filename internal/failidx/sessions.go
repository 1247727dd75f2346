package failidx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The console's sessions (idem_console_sessions): a login creates one, a
// logout revokes it, and a session cookie is honoured only while its row
// says so, so a cookie copied before a logout is worthless after it. id is
// a digest of the cookie's secret part, never the secret itself.

// CreateSession records a session of name with role, valid until expires.
func (s *Store) CreateSession(ctx context.Context, id, name string, role int, expires time.Time) error {
	if _, err := s.db.Exec(ctx, `INSERT INTO idem_console_sessions (id, name, role, expires_at) VALUES ($1, $2, $3, $4)`,
		id, clean(name), role, expires); err != nil {
		return fmt.Errorf("index: create session: %w", err)
	}
	return nil
}

// SessionLive reports whether session id exists, is not revoked and has
// not expired.
func (s *Store) SessionLive(ctx context.Context, id string) (bool, error) {
	var live bool
	err := s.db.QueryRow(ctx, `SELECT revoked_at IS NULL AND expires_at > now() FROM idem_console_sessions WHERE id = $1`, id).Scan(&live)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("index: session: %w", err)
	}
	return live, nil
}

// RevokeSession ends session id (a logout).
func (s *Store) RevokeSession(ctx context.Context, id string) error {
	if _, err := s.db.Exec(ctx, `UPDATE idem_console_sessions SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL`, id); err != nil {
		return fmt.Errorf("index: revoke session: %w", err)
	}
	return nil
}

// SweepSessions deletes sessions that expired more than a day ago.
func (s *Store) SweepSessions(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM idem_console_sessions WHERE expires_at < now() - interval '1 day'`); err != nil {
		return fmt.Errorf("index: sweep sessions: %w", err)
	}
	return nil
}
