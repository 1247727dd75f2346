// Package checkpoint runs table-driven batch jobs that resume after a crash
// (seed §9: a batch resumes from its checkpoint after a failure).
//
// A [Job] reads the rows after its checkpoint in key order, a chunk at a time,
// processes them, and advances the checkpoint in the same PostgreSQL
// transaction as the chunk's effects:
//
//	BEGIN
//	SELECT pg_advisory_xact_lock(<job>)          -- runners of one job take turns
//	SELECT cursor FROM idem_checkpoint WHERE job = $1 FOR UPDATE
//	rows := Job.Read(tx, cursor, ChunkSize)      -- "WHERE id > cursor ORDER BY id LIMIT n"
//	Job.Process(tx, rows)                        -- the chunk's effects, through tx
//	UPDATE idem_checkpoint SET cursor = <key of the last row>
//	COMMIT
//
// A crash anywhere before COMMIT rolls back the chunk's effects and the
// checkpoint together, so the next run reads the same chunk again: no row is
// skipped and none is processed twice — provided Read itself never passes
// over a row that may still appear before the cursor. The plain id read
// above meets that only when nothing inserts into the table while the job
// runs: ids are drawn at INSERT, not COMMIT, so on a live table a
// transaction holding id 5 may commit after id 6 was read, and id 5 would be
// skipped. For a table written while the job runs, use [LiveTable], which
// reads in the order of the writing transaction (an xid8 column below the
// snapshot's xmin) and never skips a late commit. Effects outside the transaction (a
// call to another service) are not covered by that: give them the row's key
// as an idempotency key, as everywhere in idem.
//
// Several runners of one job may run at once (two replicas, a cron overlap):
// each chunk is read and committed under pg_advisory_xact_lock of the job, so
// they take turns chunk by chunk and never read the same chunk. A runner that
// dies releases the lock with its connection.
//
// The table is idem_checkpoint, created by idem.Migrate (or `idem migrate`)
// with every other table of idem; `idem checkpoint status` shows it and
// `idem checkpoint reset` moves a job's checkpoint.
package checkpoint
