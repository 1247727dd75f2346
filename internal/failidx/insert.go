package failidx

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/seal"
)

// insertBatch inserts a batch of dead letters, in order, skipping those whose
// (topic, partition, offset) is already indexed. previous_id links each to
// the earlier failure it repeats: the record its idem-replay-of names when
// that is indexed ($23, looked up by Insert; 0 when none), else the latest
// record committed before with the same idempotency key, origin topic and
// group. Insert links repeats within the batch itself.
const insertBatch = `INSERT INTO idem_dlq_records (dlq_topic, dlq_partition, dlq_offset, origin_topic, origin_partition,
	origin_offset, consumer_group, fingerprint, kind, msg_key, idempotency_key, attempts, first_failure_at, last_failure_at,
	error, error_type, stack, value, value_size, value_truncated, stub, headers, key_id, previous_id)
SELECT b.t, b.p, b.o, b.ot, b.op, b.oo, b.g, b.fp, b.kind, b.k, b.ikey, b.att, b.ff, b.lf, b.err, b.et, b.st, b.v, b.vs, b.vt, b.stub, b.hs,
	$24::bigint, coalesce(nullif(b.exact, 0), (SELECT max(x.id) FROM idem_dlq_records x
	 WHERE b.ikey <> '' AND x.idempotency_key = b.ikey AND x.origin_topic = b.ot AND x.consumer_group = b.g))
FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::int[], $6::bigint[], $7::text[], $8::text[], $9::text[],
	$10::bytea[], $11::text[], $12::int[], $13::timestamptz[], $14::timestamptz[], $15::text[], $16::text[], $17::text[],
	$18::bytea[], $19::int[], $20::bool[], $21::bool[], $22::bytea[], $23::bigint[])
	WITH ORDINALITY AS b(t, p, o, ot, op, oo, g, fp, kind, k, ikey, att, ff, lf, err, et, st, v, vs, vt, stub, hs, exact, ord)
ORDER BY b.ord
ON CONFLICT (dlq_topic, dlq_partition, dlq_offset) DO NOTHING
RETURNING id, idempotency_key, origin_topic, consumer_group, coalesce(previous_id, 0), dlq_topic, dlq_partition, dlq_offset`

// findReplayed returns the ids of the indexed records at the positions the
// batch's idem-replay-of headers name, one per record (0: none, or not
// indexed).
const findReplayed = `SELECT coalesce(x.id, 0) FROM unnest($1::text[], $2::int[], $3::bigint[]) WITH ORDINALITY AS r(t, p, o, ord)
LEFT JOIN idem_dlq_records x ON r.t <> '' AND x.dlq_topic = r.t AND x.dlq_partition = r.p AND x.dlq_offset = r.o
ORDER BY r.ord`

// position locates a record in a dead-letter topic.
type position struct {
	topic     string
	partition int32
	offset    int64
}

// columns holds a batch column by column, as insertBatch takes it.
type columns struct {
	topic, originTopic, group, fingerprint, kind, ikey, errText, errType, stack []string
	partition, originPartition, attempts, valueSize                             []int32
	offset, originOffset                                                        []int64
	key, value, headers                                                         [][]byte
	first, last                                                                 []time.Time
	truncated, stub                                                             []bool
	// replayOf is where each record's idem-replay-of points (topic ""
	// when it has none); exact the id of that record when indexed (0 else).
	replayTopic     []string
	replayPartition []int32
	replayOffset    []int64
	exact           []int64
}

// add appends r's row.
func (c *columns) add(r *dlq.Record, maxValue int) {
	f := r.Failure
	last := r.LastFailureAt()
	if last.IsZero() {
		last = time.Now()
	}
	first := f.FirstFailureAt
	if first.IsZero() || first.After(last) {
		first = last
	}
	value, size, truncated := r.Value, len(r.Value), false
	if len(value) > maxValue {
		value, truncated = value[:maxValue], true
	}
	if f.Stub {
		value, size = nil, f.OmittedBytes
	}
	hs := make([]Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = Header{Key: h.Key, Value: h.Value}
	}
	c.topic = append(c.topic, r.Topic)
	c.partition = append(c.partition, r.Partition)
	c.offset = append(c.offset, r.Offset)
	c.originTopic = append(c.originTopic, clean(f.OriginalTopic))
	c.originPartition = append(c.originPartition, f.OriginalPartition)
	c.originOffset = append(c.originOffset, f.OriginalOffset)
	c.group = append(c.group, clean(f.Group))
	c.fingerprint = append(c.fingerprint, r.Fingerprint())
	c.kind = append(c.kind, clean(string(f.Kind)))
	c.key = append(c.key, r.Key)
	c.ikey = append(c.ikey, clean(r.IdempotencyKey()))
	c.attempts = append(c.attempts, int32(f.Attempt))
	c.first = append(c.first, first)
	c.last = append(c.last, last)
	c.errText = append(c.errText, clean(f.Error))
	c.errType = append(c.errType, clean(f.ErrorType))
	c.stack = append(c.stack, clean(string(f.Stack)))
	c.value = append(c.value, value)
	c.valueSize = append(c.valueSize, int32(size))
	c.truncated = append(c.truncated, truncated)
	c.stub = append(c.stub, f.Stub)
	c.headers = append(c.headers, encodeHeaders(hs))
	rt, rp, _ := r.ReplayedFrom()
	c.replayTopic = append(c.replayTopic, clean(rt))
	c.replayPartition = append(c.replayPartition, rp.Partition)
	c.replayOffset = append(c.replayOffset, rp.Offset)
}

func (c *columns) args(keyID *int64) []any {
	return []any{c.topic, c.partition, c.offset, c.originTopic, c.originPartition, c.originOffset, c.group, c.fingerprint,
		c.kind, c.key, c.ikey, c.attempts, c.first, c.last, c.errText, c.errType, c.stack, c.value, c.valueSize,
		c.truncated, c.stub, c.headers, c.exact, keyID}
}

// Insert stores batch, consumed from dead-letter topics, in the index in one
// transaction, skipping the records whose (topic, partition, offset) it
// holds already, so a batch read again after a crash adds nothing. A value
// longer than maxValue bytes is stored cut to maxValue and flagged
// ValueTruncated. Each record is linked (PreviousID) to the earlier failure
// it repeats: the record its idem-replay-of header names when the index
// holds it, else the latest record with the same idempotency key, origin
// topic and group, within the batch too.
//
// One statement looks up the records the batch's idem-replay-of headers
// name, one inserts the batch, and a last one links repeats within the
// batch. index.Indexer calls it (InsertSealed) for each batch it reads.
func Insert(ctx context.Context, pool *pgxpool.Pool, batch []*sarama.ConsumerMessage, maxValue int) error {
	return InsertSealed(ctx, pool, batch, maxValue, nil)
}

// InsertSealed is Insert that, when sl is not nil, seals each record's value
// and headers under sl's current data key (internal/seal), in the batch's
// transaction, and stores the key's id with the rows (see columns.seal).
func InsertSealed(ctx context.Context, pool *pgxpool.Pool, batch []*sarama.ConsumerMessage, maxValue int, sl *seal.Sealer) error {
	var c columns
	for _, m := range batch {
		c.add(dlq.FromMessage(m), maxValue)
	}
	// The batch's own positions, and where each row's idem-replay-of points.
	replayOf := map[position]position{}
	replays := false
	for i := range c.topic {
		if c.replayTopic[i] != "" {
			replays = true
			replayOf[position{c.topic[i], c.partition[i], c.offset[i]}] = position{c.replayTopic[i], c.replayPartition[i], c.replayOffset[i]}
		}
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		c.exact = make([]int64, len(c.topic))
		if replays {
			rows, err := tx.Query(ctx, findReplayed, c.replayTopic, c.replayPartition, c.replayOffset)
			if err != nil {
				return err
			}
			if c.exact, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
				return err
			}
		}
		keyID, err := c.seal(ctx, tx, sl)
		if err != nil {
			return err
		}
		type inserted struct {
			id, prev            int64
			ikey, origin, group string
			at                  position
		}
		rows, err := tx.Query(ctx, insertBatch, c.args(keyID)...)
		if err != nil {
			return err
		}
		ins, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (inserted, error) {
			var i inserted
			err := row.Scan(&i.id, &i.ikey, &i.origin, &i.group, &i.prev, &i.at.topic, &i.at.partition, &i.at.offset)
			return i, err
		})
		if err != nil {
			return err
		}
		// A repeat of a record inserted earlier in this same statement did
		// not see it: link it now. A record whose idem-replay-of names a
		// record of the batch links to that one; one whose idem-replay-of
		// was found indexed keeps that link; the others link by key.
		slices.SortFunc(ins, func(a, b inserted) int { return cmp.Compare(a.id, b.id) })
		byPos := make(map[position]int64, len(ins))
		for _, i := range ins {
			byPos[i.at] = i.id
		}
		exact := map[position]bool{}
		for i := range c.topic {
			if c.exact[i] != 0 {
				exact[position{c.topic[i], c.partition[i], c.offset[i]}] = true
			}
		}
		latest := map[[3]string]int64{}
		var ids, prevs []int64
		for _, i := range ins {
			k := [3]string{i.ikey, i.origin, i.group}
			from, replayed := replayOf[i.at]
			switch p, inBatch := byPos[from]; {
			case replayed && inBatch && p != i.prev:
				ids, prevs = append(ids, i.id), append(prevs, p)
			case replayed && (inBatch || exact[i.at]):
			case i.ikey == "":
			default:
				if p, ok := latest[k]; ok && p > i.prev {
					ids, prevs = append(ids, i.id), append(prevs, p)
				}
			}
			if i.ikey != "" {
				latest[k] = i.id
			}
		}
		if len(ids) > 0 {
			_, err = tx.Exec(ctx, `UPDATE idem_dlq_records r SET previous_id = v.prev
				FROM unnest($1::bigint[], $2::bigint[]) AS v(id, prev) WHERE r.id = v.id`, ids, prevs)
		}
		return err
	})
}
