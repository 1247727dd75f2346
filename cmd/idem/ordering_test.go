package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// readN reads n records of topic's partition from the start.
func readN(t *testing.T, k *idemtest.Kafka, topic string, partition int32, n int) []*sarama.ConsumerMessage {
	t.Helper()
	c, err := sarama.NewConsumer(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, partition, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var out []*sarama.ConsumerMessage
	deadline := time.After(30 * time.Second)
	for len(out) < n {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
		case <-deadline:
			t.Fatalf("read %d of %d records from %s/%d", len(out), n, topic, partition)
		}
	}
	return out
}

func hdr(m *sarama.ConsumerMessage, k string) (string, bool) {
	for _, h := range m.Headers {
		if string(h.Key) == k {
			return string(h.Value), true
		}
	}
	return "", false
}

// blockKey makes head the head of key in tier 1 of topic with parked behind it
// (partition 1, each with an idempotency-key header and one whose name is not
// UTF-8); promoted, when set, is promoted from the parked ones with its
// forward left pending, as a revoke between Promote and the send leaves it.
func blockKey(t *testing.T, pool *pgxpool.Pool, group, topic string, key []byte, head string, parked []string, promote bool) {
	t.Helper()
	ctx := t.Context()
	s := keyorder.New(pool, group)
	if err := s.BlockTier(ctx, topic, key, head, 1); err != nil {
		t.Fatal(err)
	}
	for i, ik := range parked {
		st, err := s.Park(ctx, keyorder.Record{Topic: topic, Key: key, IdempotencyKey: ik, Partition: 1, Offset: int64(10 + i),
			Timestamp: time.UnixMilli(1_700_000_000_000).UTC(), Value: []byte("v-" + ik),
			Headers: []keyorder.Header{{Key: "idempotency-key", Value: []byte(ik)}, {Key: "\xff\x00name", Value: nil}}})
		if err != nil || st != keyorder.Blocked {
			t.Fatalf("park %s: %v %v", ik, st, err)
		}
	}
	if !promote {
		return
	}
	next, _, err := s.Next(ctx, topic, key, head)
	if err != nil {
		t.Fatal(err)
	}
	next.Tier = 1
	var hs []sarama.RecordHeader
	for _, h := range next.Headers {
		hs = append(hs, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	now := time.Now()
	next.Headers = nil
	for _, h := range wire.Encode(hs, retrytopic.Failure{Attempt: 1, Tier: 1, DueAt: now, OriginalTopic: topic, OriginalPartition: 1,
		OriginalOffset: next.Offset, Group: group, Kind: handler.KindRetriable, Error: "boom", FirstFailureAt: now, LastFailureAt: now}) {
		next.Headers = append(next.Headers, keyorder.Header{Key: string(h.Key), Value: h.Value})
	}
	if err := s.Promote(ctx, head, next); err != nil {
		t.Fatal(err)
	}
}

func TestOrderingCLI(t *testing.T) {
	t.Parallel()
	k := idemtest.Connect(t)
	pg := idemtest.ConnectPostgres(t) // idem's tables, as idem.Migrate creates them
	pool, db, ctx := pg.Pool, pg.URL, t.Context()
	topic, group := k.Topic(t, "orders", 2), k.Group(t, "billing")
	tier := retrytopic.Policy{}.Tier(topic, group, 1) // deleted with topic
	k.CreateTopic(t, tier, 2)
	blockKey(t, pool, group, topic, []byte("K"), "H", []string{"K0", "K1", "K2"}, true)
	blockKey(t, pool, group, topic, []byte("L"), "G", []string{"L1"}, false)
	blockKey(t, pool, group, topic, []byte{0, 1}, "B", []string{"B1"}, false)
	blockKey(t, pool, "other-"+group, topic, []byte("K"), "H", []string{"X1"}, false)
	parked := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_ordering_parked WHERE consumer_group=$1`, group).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	code, out, _ := idem(t, k, "", "ordering", "list", "--database-url", db, "--group", group)
	if code != 0 || !strings.Contains(out, "hex:0001") || !strings.Contains(out, "K0") ||
		!strings.Contains(out, "group "+group+" topic "+topic+": 3 blocked keys, 4 parked messages") || strings.Contains(out, "other-") {
		t.Fatalf("list: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "ordering", "list", "--database-url", db, "--json")
	var listed struct {
		Keys []struct {
			Group   string  `json:"group"`
			Key     *string `json:"key"`
			KeyHex  string  `json:"key_hex"`
			Pending bool    `json:"pending"`
			Parked  int     `json:"parked"`
		} `json:"keys"`
		Totals []struct {
			Group  string `json:"group"`
			Keys   int    `json:"keys"`
			Parked int    `json:"parked"`
		} `json:"totals"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Keys) != 4 || len(listed.Totals) != 2 {
		t.Fatalf("list --json: code %d %+v\n%s", code, listed, out)
	}

	// An unknown destination is refused before anything changes, and is not created.
	nowhere := topic + ".nowhere" // deleted with topic, were it created
	code, _, errOut := idem(t, k, "", "ordering", "release", "--database-url", db, "--group", group, "--topic", topic, "--key", "K", "--to", nowhere)
	if code != 1 || !strings.Contains(errOut, "unknown topic") {
		t.Fatalf("release --to unknown: code %d %s", code, errOut)
	}
	if n := parked(); n != 4 {
		t.Fatalf("%d parked after a refused release, want 4", n)
	}
	if topics, err := admin(t, k).ListTopics(); err != nil {
		t.Fatal(err)
	} else if _, ok := topics[nowhere]; ok {
		t.Fatalf("release created topic %s", nowhere)
	}

	// K back to the source: the pending K0 first, then K1, K2; original headers
	// byte for byte, no idem-* headers, same partition.
	code, out, _ = idem(t, k, "", "ordering", "release", "--database-url", db, "--group", group, "--topic", topic, "--key", "K", "--to", "source")
	if code != 0 || !strings.Contains(out, "released 3 messages of 1 keys") {
		t.Fatalf("release --key: code %d\n%s", code, out)
	}
	var got []string
	for _, m := range readN(t, k, topic, 1, 3) {
		ik, _ := hdr(m, "idempotency-key")
		got = append(got, ik)
		if _, ok := hdr(m, "\xff\x00name"); !ok || string(m.Key) != "K" || string(m.Value) != "v-"+ik {
			t.Fatalf("released record %s lost its key, value or binary header: %+v", ik, m.Headers)
		}
		for _, h := range m.Headers {
			if wire.IsIdemHeader(h.Key) {
				t.Fatalf("released to source with header %s", h.Key)
			}
		}
	}
	if !slices.Equal(got, []string{"K0", "K1", "K2"}) {
		t.Fatalf("released to source in order %v", got)
	}

	// The rest to the first tier: due now in tier 1 of topic for group.
	code, out, _ = idem(t, k, "", "ordering", "release", "--database-url", db, "--group", group, "--topic", topic, "--all", "--dry-run", "--to", tier)
	if code != 0 || !strings.Contains(out, "would release 2 messages of 2 keys") || parked() != 2 {
		t.Fatalf("release --dry-run: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "ordering", "release", "--database-url", db, "--group", group, "--topic", topic, "--all", "--to", tier)
	if code != 0 || !strings.Contains(out, "released 2 messages of 2 keys") {
		t.Fatalf("release --all: code %d\n%s", code, out)
	}
	for _, m := range readN(t, k, tier, 1, 2) {
		f, ok, err := wire.Decode(m.Headers)
		if !ok || err != nil || f.Tier != 1 || f.Group != group || f.OriginalTopic != topic || f.OriginalPartition != 1 || f.DueAt.After(time.Now()) {
			t.Fatalf("record in the tier: %+v %v %v", f, ok, err)
		}
	}
	if n := parked(); n != 0 {
		t.Fatalf("%d parked after release --all", n)
	}
	code, out, _ = idem(t, k, "", "ordering", "list", "--database-url", db, "--group", group)
	if code != 0 || !strings.Contains(out, "no blocked keys") {
		t.Fatalf("list after release: code %d\n%s", code, out)
	}
	// The other group's rows were not touched.
	code, out, _ = idem(t, k, "", "ordering", "list", "--database-url", db, "--group", "other-"+group)
	if code != 0 || !strings.Contains(out, "1 blocked keys, 1 parked messages") {
		t.Fatalf("list other group: code %d\n%s", code, out)
	}
}

func TestOrderingCLIBadInput(t *testing.T) {
	t.Parallel()
	k := idemtest.Connect(t)
	db := idemtest.ConnectPostgres(t).URL
	topic := k.Topic(t, "orders", 1)
	base := []string{"ordering", "release", "--database-url", db, "--group", "g", "--topic", topic}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no key", append(slices.Clone(base), "--to", "source"), "exactly one of"},
		{"key and all", append(slices.Clone(base), "--key", "K", "--all", "--to", "source"), "exactly one of"},
		{"no destination", append(slices.Clone(base), "--all"), `"to" not set`},
		{"no group", []string{"ordering", "release", "--database-url", db, "--topic", topic, "--all", "--to", "source"}, `"group" not set`},
		{"bad hex", append(slices.Clone(base), "--key-hex", "zz", "--to", "source"), "--key-hex"},
		{"no database", []string{"ordering", "list", "--database-url", ""}, "DATABASE_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := idem(t, k, "", tt.args...)
			if code != 1 || !strings.HasPrefix(errOut, "idem: ") || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errOut, tt.want)
			}
		})
	}
}
