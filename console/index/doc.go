// Package index is the durable failure index of idem's console: a PostgreSQL
// table with one row per dead-letter record, its per-record status, the edits
// made to it and an audit of every action taken.
//
// An Indexer tails the dead-letter topics with a consumer group of its own
// ("idem-console-indexer" by default) and stores every record once, keyed by its topic, partition
// and offset. The row keeps what an operator needs after the record has left
// Kafka: the origin coordinates, group, fingerprint (as `idem dlq list`
// computes it), kind, Kafka key, idempotency key, attempts, failure times,
// error and stack, and a copy of the value (capped; stubs flagged) and
// headers. Topic retention can no longer lose a failure.
//
// Each record has a status: Unresolved when indexed, then Replayed, Resolved
// or Archived, each with actor, time and reason. Store reads the index
// (Overview, Groups, List with cursor paging, Get, Audit); Actions change it
// (Replay, Resolve, Archive, EditAndRetry) and write one audit row each.
// Replaying a subset leaves the others Unresolved. A replayed record that
// fails again is indexed as a new record whose PreviousID points at the
// earlier one: the dead letter its idem-replay-of header names (every replay
// and edit-and-retry writes it), else the latest with the same idempotency
// key, origin topic and group.
//
//	if err := idem.Migrate(ctx, pool); err != nil { // every idem table, the index's among them
//		log.Fatal(err)
//	}
//	ix := &index.Indexer{Brokers: brokers, Pool: pool, Registerer: reg}
//	go ix.Run(ctx) // returns nil when ctx ends
//
//	s := index.NewStore(pool)
//	page, err := s.List(ctx, index.Filter{Status: []index.Status{index.Unresolved}}, "", 50)
//	if err != nil {
//		log.Fatal(err)
//	}
//	client, err := sarama.NewClient(brokers, index.ProducerConfig(nil))
//	if err != nil {
//		log.Fatal(err)
//	}
//	a := index.NewActions(s, client)
//	res, err := a.Replay(ctx, "alice", index.Selection{IDs: []int64{page.Records[0].ID}}, "", 0, "fixed the bug")
//
// Indexer.Registerer (and console.Config.Registerer, for a console that runs
// no indexer) exports idem_dlq_unresolved and
// idem_dlq_oldest_unresolved_seconds per group and topic, read from the
// index, and idem_dlq_retention_seconds (see Store.Collector).
package index
