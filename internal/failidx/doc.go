// Package failidx is the failure index behind idem's console: the records
// of idem_dlq_records with their status, edits and audit (the tables
// internal/tables creates), read by a Store, changed by Actions on an
// operator's behalf, filled by Insert, and measured by a Collector.
//
// Only idem uses it: index.Indexer (package console/index) fills the index,
// console.New serves it over HTTP, and `idem dlq … --database-url` reads and
// replays from it. Users reach it through those, never by name: the types
// here appear in no exported signature of a public package.
//
// Replays go through forward.Replay, as dlq.Client.Replay's do, so a
// record replayed from the console and one replayed by `idem dlq replay`
// are built the same way.
package failidx
