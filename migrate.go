package idem

import (
	"context"
	"fmt"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/schema"
)

// A MigrateOption names a table Migrate creates under another name than
// its default.
type MigrateOption func(*migrateConfig)

type migrateConfig struct {
	inbox  []dedupe.PostgresOption
	outbox []string
}

// Inbox makes Migrate create the inbox as the store of
// dedupe.NewPostgres(db, opts...) uses it: give both the same options, once.
// dedupe.WithTable names it (default idem_processed), optionally
// schema-qualified ("billing.idem_processed"; the schema must exist);
// dedupe.WithPartitions range-partitions it by time, one partition per
// every (24h: a day, 168h: a week), or converts an existing plain inbox,
// moving no row: the plain table becomes the oldest partition (see
// docs/partitioned-inbox.md).
//
//	inbox := []dedupe.PostgresOption{dedupe.WithPartitions(7 * 24 * time.Hour)}
//	err := idem.Migrate(ctx, pool, idem.Inbox(inbox...))
//	store := dedupe.NewPostgres(pool, inbox...)
func Inbox(opts ...dedupe.PostgresOption) MigrateOption {
	return func(c *migrateConfig) { c.inbox = append(c.inbox, opts...) }
}

// OutboxTable makes Migrate create the outbox as name instead of the
// default idem_outbox, as outbox.Relay.Table names it; give it once per
// outbox table when a database holds several.
func OutboxTable(name string) MigrateOption {
	return func(c *migrateConfig) { c.outbox = append(c.outbox, name) }
}

// Migrate creates or upgrades every table idem keeps in PostgreSQL. It is the
// one migration entry point a service needs; `idem migrate` runs it from a
// shell. The tables, by the package that uses them:
//
//   - dedupe (the inbox of dedupe.Postgres and dedupe.PostgresLease):
//     idem_processed, or the name Inbox's dedupe.WithTable gives, with the
//     index the sweeper uses (partitioned by time with Inbox's
//     dedupe.WithPartitions);
//   - consumer's ordering by key: idem_ordering_heads, idem_ordering_parked;
//     and, with Transactions, the OnDeadLettered calls a Kafka transaction
//     owes until it commits: idem_txn_hooks, and the owner of each claimed
//     partition, which fences a member that lost it: idem_ordering_claims;
//   - outbox: idem_outbox, or each OutboxTable's name, with its NOTIFY
//     trigger;
//   - saga: idem_saga, idem_saga_step;
//   - checkpoint: idem_checkpoint;
//   - console/index (the failure index of idem console and
//     consumer.Config.FailureIndex): idem_dlq_records, idem_dlq_groups,
//     idem_dlq_versions, idem_dlq_audit;
//   - schedule (the messages handler.DeferUntil defers): idem_deferred;
//   - step (durable steps, step.Do): idem_steps;
//   - payload encryption at rest (index.Indexer.EncryptionKeyFile): the
//     wrapped data keys, idem_seal_keys;
//   - the live controls (consumer.Config.Controls, idem console's pauses,
//     re-drives and fleet): idem_control_pauses, idem_control_redrives,
//     idem_control_redrive_parts, idem_control_members, with the trigger
//     that NOTIFYs a group's members of a change;
//   - and idem_schema_migrations, which records the versions applied.
//
// Unqualified names resolve through the connection's search_path. Every
// step is versioned and runs under one advisory lock, so Migrate is
// idempotent and safe when several replicas start at once: a service may
// call it at every start. db is a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
func Migrate(ctx context.Context, db dedupe.DB, opts ...MigrateOption) error {
	var c migrateConfig
	for _, o := range opts {
		o(&c)
	}
	if err := schema.Migrate(ctx, db, c.inbox, c.outbox); err != nil {
		return fmt.Errorf("idem: %w", err)
	}
	return nil
}
