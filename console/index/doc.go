// Package index fills the durable failure index of idem's console: a
// PostgreSQL table with one row per dead-letter record, its per-record
// status, the edits made to it and an audit of every action taken.
//
// An Indexer tails the dead-letter topics with a consumer group of its own
// ("idem-console-indexer" by default) and stores every record once, keyed by
// its topic, partition and offset. The row keeps what an operator needs
// after the record has left Kafka: the origin coordinates, group,
// fingerprint (dlq.Record.Fingerprint, as `idem dlq list` groups by it),
// kind, Kafka key, idempotency key, attempts, failure times, error and
// stack, and a copy of the value (capped; stubs flagged) and headers. Topic
// retention can no longer lose a failure.
//
// Each record has a status: unresolved when indexed, then replayed,
// resolved or archived, each with actor, time and reason. The console
// (console.New, `idem console`) and the CLI (`idem dlq list|show|replay
// --database-url`) read the index and act on it, and every action writes one
// audit row. A replayed record that fails again is indexed as a new record
// linked to the earlier one: the dead letter its idem-replay-of header names
// (every replay and edit-and-retry writes it; dlq.Record.ReplayedFrom reads
// it), else the latest with the same idempotency key, origin topic and
// group.
//
//	if err := idem.Migrate(ctx, pool); err != nil { // every idem table, the index's among them
//		log.Fatal(err)
//	}
//	ix := &index.Indexer{Brokers: brokers, Pool: pool, Registerer: reg}
//	go ix.Run(ctx) // returns nil when ctx ends
//
//	pcfg := sarama.NewConfig()
//	retrytopic.ConfigureProducer(pcfg) // for the console's replays: idempotent, acks=all, no topic auto-creation
//	client, err := sarama.NewClient(brokers, pcfg)
//	if err != nil {
//		log.Fatal(err)
//	}
//	tokens, err := console.LoadTokens("/etc/idem/console-tokens")
//	if err != nil {
//		log.Fatal(err)
//	}
//	h, err := console.New(console.Config{Pool: pool, Client: client, Tokens: tokens, Registerer: reg})
//	if err != nil {
//		log.Fatal(err)
//	}
//	http.Handle("/", h)
//
// A service may also run the indexer inside consumer.Run
// (consumer.Config.FailureIndex).
//
// Indexer.Registerer (and console.Config.Registerer, for a console that runs
// no indexer) exports idem_dlq_unresolved and
// idem_dlq_oldest_unresolved_seconds per group and topic, read from the
// index, and idem_dlq_retention_seconds: given the same Registerer, they
// share one collector.
package index
