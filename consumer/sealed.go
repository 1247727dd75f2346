package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/pgmigrate"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/wire"
)

// Payload encryption at rest of what the consumer keeps in PostgreSQL
// (issue 29, item 16; Config.EncryptionKeyFile): the messages parked behind
// their key's head (internal/keyorder, purpose "ordering") and the deferred
// messages (internal/tables, purpose "deferred") are sealed with
// internal/seal when they are written and opened when they are read. A
// message whose payload cannot be opened for good (its data key destroyed,
// or tampered with: seal.Unreadable) is never handled or published: the
// drain dead-letters a parked one as a stub (unreadableOut), and the
// scheduler a deferred one (schedule.Scheduler, to the dead-letter topic
// recorded here: deferDLQ).

// encryption checks EncryptionKeyFile and EncryptionKey.
func (c configCheck) encryption() {
	if c.EncryptionKeyFile != "" && c.EncryptionKey != "" {
		c.errs.Bad("EncryptionKey", "(set)", "give the key-encryption key in EncryptionKeyFile or EncryptionKey, not both")
	}
}

// sealPayloads reads Config's key-encryption key and makes the sealers of
// the parked messages (r.order) and of the deferred ones (r.deferSealer),
// each creating idem_seal_keys if need be; nothing without a key. A key
// that does not unwrap the data keys already written is an error Run
// returns (retrying cannot help); the database briefly down is retried.
func (r *runner) sealPayloads(ctx context.Context, st setup) error {
	keks, err := seal.LoadKEKs(r.cfg.EncryptionKeyFile, r.cfg.EncryptionKey)
	if err != nil || keks == nil {
		if err != nil {
			return fmt.Errorf("consumer: encryption key: %w", err)
		}
		return nil
	}
	open := func(db dedupe.DB, purpose string) (*seal.Sealer, error) {
		sdb, ok := db.(interface {
			seal.DB
			pgmigrate.DB
		})
		if !ok {
			return nil, fmt.Errorf("consumer: encryption at rest of %s payloads needs a *pgxpool.Pool, not a %T", purpose, db)
		}
		var sl *seal.Sealer
		err := st.retry(ctx, nil, "reading the "+purpose+" payloads' data keys", func() error {
			if err := seal.Migrate(ctx, sdb); err != nil {
				return err
			}
			var err error
			sl, err = seal.New(ctx, seal.Config{DB: sdb, KEKs: keks, Purpose: purpose})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("consumer: encryption at rest: %w", err)
		}
		return sl, nil
	}
	if r.order != nil {
		sl, err := open(r.cfg.Ordering.db, keyorder.Purpose)
		if err != nil {
			return err
		}
		r.order = r.order.Sealed(sl)
	}
	if r.cfg.Defer != nil {
		if r.deferSealer, err = open(r.cfg.Defer.Pool, tables.DeferredPurpose); err != nil {
			return err
		}
	}
	r.log.Info("idem: parked and deferred payloads are encrypted at rest", "kek_id", keks[0].ID())
	return nil
}

// errUnreadable marks the failure of a message whose payload, sealed at
// rest, cannot be opened for good.
var errUnreadable = errors.New("consumer: the message's payload, sealed at rest, cannot be opened")

// unreadable is the failure of a parked or deferred message whose payload
// cannot be opened: permanent, so its dead-letter topic is its rule's for a
// permanent failure.
func unreadable(why error) error {
	return handler.Permanent(fmt.Errorf("%w: %w", errUnreadable, why))
}

// deferDLQ is the dead-letter topic recorded with a deferred message of
// origin topic: where the scheduler sends its stub if its payload cannot be
// opened by the time it is due.
func (r *runner) deferDLQ(topic string) string {
	return r.rules.Decide(unreadable(seal.ErrKeyDestroyed)).Retry.DLQ(topic, r.cfg.Group)
}

// asStub makes out, a dead-letter record of a message whose payload cannot
// be opened, a stub: no value, none of the message's own headers (they
// were sealed with it), the wire contract's with idem-payload-omitted.
func (o outbound) asStub() outbound {
	o.f.Stub = true
	o.stub = true
	o.rec.Value = nil
	o.rec.Headers = wire.Encode[*sarama.RecordHeader](nil, o.f)
	return o
}

// unreadableRecord is the outbound of the pending head rec whose payload
// cannot be opened (rec.Unreadable): its stub, to the dead-letter topic of
// its rule, instead of its forward to a tier.
func (r parkedRecords) unreadableRecord(rec keyorder.Record) outbound {
	out := r.pendingOutbound(rec)
	dlq := out.dlq
	src := wire.Source{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp, Group: r.cfg.Group}
	f := wire.NewFailure(unreadable(rec.Unreadable), src, out.f, time.Now())
	f.IdempotencyKey = rec.IdempotencyKey
	out.f, out.tier, out.kind, out.rec.Topic = f, 0, string(f.Kind), dlq
	return out.asStub()
}
