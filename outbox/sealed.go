package outbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/internal/pglead"
	"github.com/idemhq/idem/internal/seal"
)

// Payload encryption at rest of outbox rows (issue 29, item 16;
// Relay.EncryptionKeyFile): Relay.Enqueue seals each row's value and
// headers (internal/seal, purpose "outbox") bound to its event id, and the
// relay opens them before it publishes. A row whose payload cannot be
// opened for good (its data key destroyed, or tampered with) is never
// published: it moves to the failed state with the reason as its
// last_error (`idem outbox list --failed`, the console's failed outbox
// rows, idem_outbox_failed).

// Enqueue is Enqueue into r.Table (the default table when empty), sealing
// each message's value and headers at rest when r has a key-encryption key
// (EncryptionKeyFile or EncryptionKey): they are stored as one blob sealed
// with AES-256-GCM under the outbox's current data key, bound to the row's
// event id, and the relay of the table, given the same key, opens them
// before it publishes. The topic, the Kafka key and the delay stay in
// clear. Only Table and the encryption fields are read: a service that
// enqueues and the process that runs the relay give the same values, in
// one Relay or in two. With a key, each call reads the key file (when
// given) and the outbox's current data key in tx, one query more.
func (r *Relay) Enqueue(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	sl, err := r.writer()
	if err != nil {
		return err
	}
	return enqueue(ctx, tx, r.Table, sl, msgs)
}

// writer is the sealer Enqueue seals with; nil without a key.
func (r *Relay) writer() (*seal.Sealer, error) {
	if r.EncryptionKeyFile != "" && r.EncryptionKey != "" {
		return nil, fmt.Errorf("%w: Relay.EncryptionKeyFile and Relay.EncryptionKey are both set: give the key-encryption key one way", ErrInvalidConfig)
	}
	keks, err := seal.LoadKEKs(r.EncryptionKeyFile, r.EncryptionKey)
	if err != nil || keks == nil {
		if err != nil {
			err = fmt.Errorf("outbox: encryption key: %w", err)
		}
		return nil, err
	}
	return seal.ForWriting(seal.Config{KEKs: keks, Purpose: outboxstore.Purpose})
}

// newEventID returns a random UUID (version 4) as text.
func newEventID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// startSealer makes the relay's sealer when it has a key (after creating
// idem_seal_keys): a KEK that does not unwrap the outbox's data keys ends
// Run (s.fatal), as retrying cannot help.
func (s *session) startSealer(ctx context.Context) error {
	if s.keks == nil || s.sealer != nil {
		return nil
	}
	if err := seal.Migrate(ctx, s.cfg.Pool); err != nil {
		return err
	}
	sl, err := seal.New(ctx, seal.Config{DB: s.cfg.Pool, KEKs: s.keks, Purpose: outboxstore.Purpose})
	if errors.Is(err, seal.ErrWrongKEK) {
		s.fatal = fmt.Errorf("outbox: encryption at rest: %w", err)
		return fmt.Errorf("%w: %w", pglead.ErrGiveUp, s.fatal)
	}
	if err != nil {
		return err
	}
	s.sealer = sl
	return nil
}

// reasonUnreadable and reasonNoKey label idem_outbox_publish_failures_total
// for a sealed row the relay cannot open: for good (failed at once), or
// because it was given no key (retried).
const (
	reasonUnreadable = "unreadable"
	reasonNoKey      = "no_key"
)

// open opens the sealed heads in place, and returns the heads to publish
// and the failures of those it cannot open: a row whose payload cannot be
// opened for good fails for good (the failed state, never published), a
// sealed row read without a key is retried later. Another error (the
// database) ends the round.
func (s *session) open(ctx context.Context, heads []row) ([]row, []failure, error) {
	var out []row
	var failed []failure
	for _, h := range heads {
		if h.keyID == nil {
			out = append(out, h)
			continue
		}
		var err error
		if s.sealer == nil {
			err = fmt.Errorf("outbox row %d: %w (give the relay EncryptionKeyFile)", h.id, seal.ErrNoKey)
		} else if err = s.openRow(ctx, &h); err == nil {
			out = append(out, h)
			continue
		} else if !seal.Unreadable(err) {
			return nil, nil, fmt.Errorf("outbox: open row %d: %w", h.id, err)
		}
		f := failure{id: h.id, err: err.Error(), reason: reasonNoKey, final: s.sealer != nil, wait: s.retryWait(h.attempts + 1)}
		if f.final {
			f.reason = reasonUnreadable
			s.log.Error("idem: an outbox row's payload cannot be opened for good; marked failed, never published",
				"id", h.id, "event_id", h.eventID, "topic", h.topic, "err", err)
		} else {
			s.log.Warn("idem: an outbox row is sealed and the relay has no encryption key; will retry", "id", h.id, "in", f.wait)
		}
		s.m.PublishFailures.WithLabelValues(s.t.name, f.reason).Inc()
		failed = append(failed, f)
	}
	return out, failed, nil
}

// openRow opens h's sealed value and headers into it.
func (s *session) openRow(ctx context.Context, h *row) error {
	pt, err := s.sealer.Open(ctx, *h.keyID, h.sealed, outboxstore.AAD(s.t.name, h.eventID))
	if err != nil {
		return err
	}
	value, hs, err := seal.Unpack(pt)
	if err != nil {
		return err
	}
	h.value, h.hkeys, h.hvals = value, make([]string, len(hs)), make([][]byte, len(hs))
	for i, x := range hs {
		h.hkeys[i], h.hvals[i] = string(x.Key), x.Value
	}
	return nil
}

// openHeads is open for a round: the failures are recorded at once (the
// failed ones leave the pending rows), and the heads left are returned.
func (s *session) openHeads(ctx context.Context, conn *pgx.Conn, heads []row) ([]row, error) {
	out, failed, err := s.open(ctx, heads)
	if err != nil || len(failed) == 0 {
		return out, err
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.QueryTimeout)
	defer cancel()
	return out, s.settle(actx, conn, nil, failed)
}
