// Package outboxstore is the outbox's storage, configuration and
// administration, everything about an outbox table that package outbox
// shares with the CLI, the failure console and idem.Migrate:
//
//   - configuration (config.go): the defaults of outbox.Relay's fields that
//     `idem outbox relay` shows as its flags' defaults, the table name
//     ("table" or "schema.table") and how it is parsed and quoted, the
//     ErrInvalidConfig sentinel (outbox.ErrInvalidConfig), the relay's
//     producer settings (ProducerConfig) and the header that carries a
//     row's event id (HeaderID). Package outbox documents each default on
//     its field ("Default:" lines, checked by its TestDocumentedDefaults);
//   - storage (table.go, migrations/): the SQL of the table package outbox
//     enqueues into and its relay publishes from, with its indexes, its
//     NOTIFY trigger and the table of Relay.ExactlyOnce's rounds.
//     idem.Migrate (through internal/schema) and outbox.Relay.Run call
//     Migrate; a service never needs to;
//   - administration (admin.go): reading and retrying rows for
//     `idem outbox list`, `idem outbox retry` and the failure console's
//     outbox page. A service enqueues with outbox.Enqueue and runs an
//     outbox.Relay; it has no need to list rows.
//
// The outbox's table lives here rather than in internal/tables because
// each outbox table is named by its user (Relay.Table) and its SQL is a
// template over that name, parsed and quoted by this package.
package outboxstore
