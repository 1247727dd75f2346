package failidx

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/wire"
)

// parkedPage is one page of the keys ordering holds blocked, after the key
// ($1, $2, $3) in (group, topic, key digest) order: the head rows and the
// parked rows of each key, aggregated for that page only.
const parkedPage = `
WITH h AS (
	SELECT consumer_group, topic, key_digest, msg_key, head_key, since FROM idem_ordering_heads
	WHERE (consumer_group, topic, key_digest) > ($1, $2, $3)
	ORDER BY consumer_group, topic, key_digest LIMIT $4
), p AS (
	SELECT consumer_group, topic, key_digest, (array_agg(msg_key))[1] AS msg_key, count(*) AS n, min(parked_at) AS oldest
	FROM idem_ordering_parked WHERE NOT drained AND (consumer_group, topic, key_digest) > ($1, $2, $3)
	  AND (consumer_group, topic, key_digest) IN (
		SELECT DISTINCT consumer_group, topic, key_digest FROM idem_ordering_parked
		WHERE NOT drained AND (consumer_group, topic, key_digest) > ($1, $2, $3)
		ORDER BY consumer_group, topic, key_digest LIMIT $4)
	GROUP BY consumer_group, topic, key_digest
)
SELECT coalesce(h.consumer_group, p.consumer_group), coalesce(h.topic, p.topic), coalesce(h.key_digest, p.key_digest),
	coalesce(h.msg_key, p.msg_key), coalesce(h.head_key, ''), h.since, coalesce(p.n, 0), p.oldest
FROM h FULL JOIN p ON h.consumer_group = p.consumer_group AND h.topic = p.topic AND h.key_digest = p.key_digest
ORDER BY 1, 2, 3 LIMIT $4`

// ParkedKeys returns up to limit keys ByKey ordering holds blocked, every
// group and topic, in (group, topic, key digest) order, starting after
// cursor ("" for the first page), and the next page's cursor ("" on the
// last page): the page is cut in SQL, whatever the number of keys. None
// when the ordering tables do not exist. limit <= 0 means 100; it is capped
// at 1000. A cursor this method did not return is a *ValidationError.
func (a *Actions) ParkedKeys(ctx context.Context, cursor string, limit int) ([]ParkedKey, string, error) {
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, maxLimit)
	after := [3]string{}
	var digest []byte
	if cursor != "" {
		raw, err := base64.RawURLEncoding.DecodeString(cursor)
		parts := strings.SplitN(string(raw), "\x00", 3)
		if err != nil || len(parts) != 3 {
			return nil, "", invalid("cursor", "%q is not a cursor of the parked keys", cursor)
		}
		after = [3]string{parts[0], parts[1], parts[2]}
		if digest, err = hex.DecodeString(after[2]); err != nil {
			return nil, "", invalid("cursor", "%q is not a cursor of the parked keys", cursor)
		}
	}
	if digest == nil {
		digest = []byte{}
	}
	rows, err := a.store.db.Query(ctx, parkedPage, after[0], after[1], digest, limit+1)
	if isUndefinedTable(err) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("index: parked keys: %w", err)
	}
	type row struct {
		k      ParkedKey
		digest []byte
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		var key []byte
		var since, oldest *time.Time
		err := r.Scan(&x.k.Group, &x.k.Topic, &x.digest, &key, &x.k.Head, &since, &x.k.Parked, &oldest)
		x.k.Key = string(key)
		switch {
		case oldest != nil:
			x.k.Since = *oldest
		case since != nil:
			x.k.Since = *since
		}
		return x, err
	})
	if isUndefinedTable(err) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("index: parked keys: %w", err)
	}
	next := ""
	if len(got) > limit {
		got = got[:limit]
		last := got[limit-1]
		next = base64.RawURLEncoding.EncodeToString([]byte(last.k.Group + "\x00" + last.k.Topic + "\x00" + hex.EncodeToString(last.digest)))
	}
	out := make([]ParkedKey, len(got))
	for i, x := range got {
		out[i] = x.k
	}
	return out, next, nil
}

// ReleaseKey gives up the ordering of key in group and topic, as `idem
// ordering release --to source` does: the head's pending forward and every
// parked message go back to the source topic, in order, as fresh records
// (idem-* headers removed; idempotency key kept), then the key is unblocked.
// Result.Done counts the records sent. A key that is not blocked is an error
// wrapping ErrNotFound.
func (a *Actions) ReleaseKey(ctx context.Context, actor, group, topic, key, reason string) (Result, error) {
	var res Result
	if err := checkActor(actor); err != nil {
		return res, err
	}
	detail := fmt.Sprintf("group %s topic %s key %q", group, topic, key)
	fail := func(err error) (Result, error) {
		return res, a.audit(ctx, actor, "release-key", nil, detail, reason, res, err, "released")
	}
	if a.client == nil {
		return fail(errNoClient)
	}
	blocked, err := keyorder.List(ctx, a.store.db, group, topic)
	if err != nil && !isUndefinedTable(err) {
		return fail(fmt.Errorf("index: release key: %w", err))
	}
	found := false
	for _, b := range blocked {
		found = found || string(b.Key) == key
	}
	if !found {
		return fail(fmt.Errorf("%w: key %q is not blocked in group %s topic %s", ErrNotFound, key, group, topic))
	}
	res.Matched = 1
	if err := dlq.New(a.client).CheckTopic(topic); err != nil {
		return fail(err)
	}
	pub, err := newPublisher(a.client)
	if err != nil {
		return fail(err)
	}
	defer pub.close()
	n, err := keyorder.New(a.store.db, group).Release(ctx, topic, []byte(key), func(r keyorder.Record) error {
		hs := make([]sarama.RecordHeader, 0, len(r.Headers))
		for _, h := range r.Headers {
			hs = append(hs, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
		_, _, err := pub.send(ctx, forward.Record{Topic: topic, Partition: r.Partition, Key: r.Key, Value: r.Value,
			Headers: wire.StripHeaders(hs)})
		return err
	})
	res.Done = n
	if err != nil {
		return fail(err)
	}
	return res, a.audit(ctx, actor, "release-key", nil, detail, reason, res, nil, "released")
}
