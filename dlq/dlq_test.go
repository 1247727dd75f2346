package dlq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/testing/testkit"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

type seeded struct {
	key, value []byte
	idemKey    string
	origPart   int32
	kind       handler.Kind
	errType    string
	err        string
	last       time.Time
}

// seedRecords writes dead-letter records for origin (as the consumer would)
// into dlqTopic, record i to partition i%2.
func seedRecords(t *testing.T, k *idemtest.Kafka, dlqTopic, origin string) []seeded {
	t.Helper()
	base := time.UnixMilli(1_700_000_000_000)
	recs := []seeded{
		{[]byte("k1"), []byte(`{"order":1,"amount":10}`), "idem-1", 0, handler.KindRetriable, "*net.OpError", "dial tcp 10.0.0.1:5432: connect: connection refused", base.Add(1 * time.Minute)},
		{[]byte("k2"), []byte{0xff, 0x00, 0x01}, "idem-2", 1, handler.KindDecode, "*json.SyntaxError", "decode: invalid character 'x' at offset 17", base.Add(2 * time.Minute)},
		{[]byte("k3"), []byte(`{"order":3}`), "idem-3", 0, handler.KindRetriable, "*net.OpError", "dial tcp 10.0.0.2:5432: connect: connection refused", base.Add(3 * time.Minute)},
		{nil, []byte("plain"), "idem-4", 1, handler.KindDecode, "*json.SyntaxError", "decode: invalid character 'y' at offset 3", base.Add(4 * time.Minute)},
		{[]byte("k5"), nil, "idem-5", 1, handler.KindRetriable, "*net.OpError", "dial tcp 10.0.0.9:5432: connect: connection refused", base.Add(5 * time.Minute)},
	}
	out := make([]idemtest.Record, 0, len(recs))
	for i, r := range recs {
		orig := []sarama.RecordHeader{
			{Key: []byte("idempotency-key"), Value: []byte(r.idemKey)},
			{Key: []byte("trace-id"), Value: []byte(fmt.Sprint("t", i))},
		}
		f := retrytopic.Failure{
			Attempt: 3, OriginalTopic: origin, OriginalPartition: r.origPart, OriginalOffset: int64(100 + i),
			OriginalTimestamp: base, Group: "billing", Error: r.err, Kind: r.kind, ErrorType: r.errType,
			FirstFailureAt: base, LastFailureAt: r.last,
		}
		out = append(out, idemtest.Record{Partition: int32(i % 2), Key: r.key, Value: r.value, Headers: headers(wire.Encode(orig, f))})
	}
	k.Produce(t, dlqTopic, out...)
	return recs
}

// headers converts sarama's headers to the kit's.
func headers(hs []sarama.RecordHeader) []handler.Header {
	out := make([]handler.Header, len(hs))
	for i, h := range hs {
		out[i] = handler.Header{Key: string(h.Key), Value: h.Value}
	}
	return out
}

// admin returns a cluster admin on k, closed when the test ends.
func admin(t *testing.T, k *idemtest.Kafka) sarama.ClusterAdmin {
	t.Helper()
	return testkit.Admin(t, k.Brokers, k.SaramaConfig())
}

func open(t *testing.T, k *idemtest.Kafka) *dlq.Client {
	t.Helper()
	c, err := dlq.Open(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// readAll reads every record of topic (all partitions) up to the end offsets.
func readAll(t *testing.T, k *idemtest.Kafka, topic string) []*sarama.ConsumerMessage {
	t.Helper()
	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []*sarama.ConsumerMessage
	for _, p := range parts {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		if end == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case m := <-pc.Messages():
				out = append(out, m)
				if m.Offset+1 < end {
					continue
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("timeout reading %s/%d", topic, p)
			}
			break
		}
		_ = pc.Close()
	}
	return out
}

func depth(t *testing.T, c *dlq.Client, topic string) int64 {
	t.Helper()
	n, err := c.Depth(t.Context(), topic)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestListAndShow(t *testing.T) {
	k := idemtest.Connect(t)
	ctx := t.Context()
	topic, origin := k.Topic(t, "dlq", 2), k.Topic(t, "origin", 2)
	recs := seedRecords(t, k, topic, origin)
	c := open(t, k)

	if n := depth(t, c, topic); n != 5 {
		t.Fatalf("Depth = %d, want 5", n)
	}
	groups, err := c.List(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 2 {
		t.Fatalf("List = %d groups, want 2: %+v", len(groups), groups)
	}
	g := groups[0]
	if g.Count != 3 || g.Kind != handler.KindRetriable || g.ErrorType != "*net.OpError" {
		t.Errorf("group 0 = %+v", g)
	}
	if g.Message != "dial tcp <n>.<n>.<n>.<n>:<n>: connect: connection refused" {
		t.Errorf("group 0 message = %q", g.Message)
	}
	if !g.FirstSeen.Equal(recs[0].last) || !g.LastSeen.Equal(recs[4].last) {
		t.Errorf("group 0 seen %s…%s, want %s…%s", g.FirstSeen, g.LastSeen, recs[0].last, recs[4].last)
	}
	if g2 := groups[1]; g2.Count != 2 || g2.Kind != handler.KindDecode || g2.Message != `decode: invalid character "…" at offset <n>` {
		t.Errorf("group 1 = %+v", g2)
	}

	// Show by the sample's position.
	r, err := c.Show(ctx, topic, dlq.Position{Partition: g.SamplePartition, Offset: g.SampleOffset})
	if err != nil {
		t.Fatal(err)
	}
	if r.Fingerprint() != g.Fingerprint || r.Failure.OriginalTopic != origin || !r.HasFailure || r.DecodeErr != nil {
		t.Errorf("Show(sample) = %+v", r)
	}
	// Show by key and by idempotency key.
	r, err = c.Show(ctx, topic, dlq.Position{Key: "k2"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Value, recs[1].value) || r.Failure.Kind != handler.KindDecode || r.Failure.OriginalOffset != 101 || r.IdempotencyKey() != "idem-2" {
		t.Errorf("Show(key k2) = %+v", r)
	}
	if len(r.OriginalHeaders()) != 2 || string(r.OriginalHeaders()[1].Value) != "t1" {
		t.Errorf("OriginalHeaders = %q", r.OriginalHeaders())
	}
	r, err = c.Show(ctx, topic, dlq.Position{Key: "idem-4"})
	if err != nil || r.Key != nil || string(r.Value) != "plain" {
		t.Errorf("Show(idempotency key idem-4) = %+v, %v", r, err)
	}
	// Not found.
	for _, at := range []dlq.Position{{Key: "nope"}, {Partition: 0, Offset: 99}, {Partition: 7}} {
		if _, err := c.Show(ctx, topic, at); !errors.Is(err, dlq.ErrNotFound) {
			t.Errorf("Show(%+v) = %v, want ErrNotFound", at, err)
		}
	}
	if _, err := c.List(ctx, topic+".missing"); !errors.Is(err, dlq.ErrUnknownTopic) {
		t.Errorf("List(missing topic) = %v, want ErrUnknownTopic", err)
	}
}

func TestReplayToSource(t *testing.T) {
	k := idemtest.Connect(t)
	ctx := t.Context()
	topic, origin := k.Topic(t, "dlq", 2), k.Topic(t, "origin", 2)
	recs := seedRecords(t, k, topic, origin)
	c := open(t, k)

	// A dry run changes nothing.
	var progress []int64
	res, err := c.Replay(ctx, dlq.ReplayOptions{Topic: topic, DryRun: true, Progress: func(done, total int64) {
		if total != 5 {
			t.Errorf("progress total = %d", total)
		}
		progress = append(progress, done)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 5 || res.Pending != 5 || len(progress) != 5 || progress[4] != 5 {
		t.Fatalf("dry run = %+v, progress %v", res, progress)
	}
	if n := depth(t, c, topic); n != 5 {
		t.Fatalf("Depth after dry run = %d, want 5", n)
	}
	if got := readAll(t, k, origin); len(got) != 0 {
		t.Fatalf("dry run sent %d records", len(got))
	}

	res, err = c.Replay(ctx, dlq.ReplayOptions{Topic: topic, Rate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 5 || res.Skipped != 0 {
		t.Fatalf("Replay = %+v", res)
	}
	if n := depth(t, c, topic); n != 0 {
		t.Fatalf("Depth after replay = %d, want 0", n)
	}
	got := readAll(t, k, origin)
	if len(got) != 5 {
		t.Fatalf("origin has %d records, want 5", len(got))
	}
	// Where each record sits in the dead-letter topic, by idempotency key:
	// what its replay's idem-replay-of names.
	dead := map[string]string{}
	for _, m := range readAll(t, k, topic) {
		for _, h := range m.Headers {
			if string(h.Key) == "idempotency-key" {
				dead[string(h.Value)] = wire.ReplayOf(topic, m.Partition, m.Offset)
			}
		}
	}
	byIdem := map[string]*sarama.ConsumerMessage{}
	for _, m := range got {
		for _, h := range m.Headers {
			if wire.IsIdemHeader(h.Key) {
				t.Errorf("replayed record carries %s", h.Key)
			}
			if string(h.Key) == "idempotency-key" {
				byIdem[string(h.Value)] = m
			}
		}
	}
	for _, r := range recs {
		m := byIdem[r.idemKey]
		if m == nil {
			t.Fatalf("record %s not replayed with its idempotency-key header", r.idemKey)
		}
		if !bytes.Equal(m.Key, r.key) || !bytes.Equal(m.Value, r.value) || (m.Value == nil) != (r.value == nil) {
			t.Errorf("%s: key %q value %v, want %q %v", r.idemKey, m.Key, m.Value, r.key, r.value)
		}
		if m.Partition != r.origPart {
			t.Errorf("%s: partition %d, want original %d", r.idemKey, m.Partition, r.origPart)
		}
		if len(m.Headers) != 3 || string(m.Headers[1].Key) != "trace-id" || string(m.Headers[2].Key) != wire.HeaderReplayOf ||
			string(m.Headers[2].Value) != dead[r.idemKey] {
			t.Errorf("%s: headers %v, want the 2 originals and %s=%s", r.idemKey, m.Headers, wire.HeaderReplayOf, dead[r.idemKey])
		}
	}

	// The commit means a second replay replays nothing.
	res, err = c.Replay(ctx, dlq.ReplayOptions{Topic: topic})
	if err != nil || res.Replayed != 0 || res.Pending != 0 {
		t.Fatalf("second Replay = %+v, %v; want nothing", res, err)
	}
	if got := readAll(t, k, origin); len(got) != 5 {
		t.Fatalf("origin has %d records after the second replay, want 5", len(got))
	}
}

func TestReplayFilterAndPurge(t *testing.T) {
	k := idemtest.Connect(t)
	ctx := t.Context()
	topic, origin := k.Topic(t, "dlq", 2), k.Topic(t, "origin", 2)
	seedRecords(t, k, topic, origin)
	c := open(t, k)

	f, err := dlq.ParseFilter("kind=decode,error~=character 'x'")
	if err != nil {
		t.Fatal(err)
	}
	// Without DropUnmatched the filtered replay is refused: it would drop
	// the 4 records the filter skips from pending.
	res, err := c.Replay(ctx, dlq.ReplayOptions{Topic: topic, Filter: f})
	if !errors.Is(err, dlq.ErrUnmatched) || res.Replayed != 1 || res.Skipped != 4 {
		t.Fatalf("filtered Replay = %+v, %v; want ErrUnmatched", res, err)
	}
	if n := depth(t, c, topic); n != 5 || len(readAll(t, k, origin)) != 0 {
		t.Fatalf("the refused replay changed something: depth %d", n)
	}
	// A filter matching nothing is refused too.
	none, _ := dlq.ParseFilter("key=no-such-key")
	if _, err := c.Replay(ctx, dlq.ReplayOptions{Topic: topic, Filter: none, DropUnmatched: true}); !errors.Is(err, dlq.ErrNothingMatched) {
		t.Fatalf("Replay matching nothing = %v, want ErrNothingMatched", err)
	}
	if n := depth(t, c, topic); n != 5 {
		t.Fatalf("Depth after a replay matching nothing = %d, want 5", n)
	}
	res, err = c.Replay(ctx, dlq.ReplayOptions{Topic: topic, Filter: f, DropUnmatched: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 1 || res.Skipped != 4 {
		t.Fatalf("filtered Replay = %+v, want 1 replayed, 4 skipped", res)
	}
	got := readAll(t, k, origin)
	if len(got) != 1 || string(got[0].Key) != "k2" {
		t.Fatalf("origin got %d records (%v)", len(got), got)
	}
	// With DropUnmatched, skipped records are no longer pending (documented).
	if n := depth(t, c, topic); n != 0 {
		t.Fatalf("Depth = %d, want 0", n)
	}

	// New failures arrive; Purge drops them from pending.
	seedRecords(t, k, topic, origin)
	if n := depth(t, c, topic); n != 5 {
		t.Fatalf("Depth = %d, want 5", n)
	}
	n, err := c.Purge(ctx, topic)
	if err != nil || n != 5 {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	if n := depth(t, c, topic); n != 0 {
		t.Fatalf("Depth after purge = %d", n)
	}
	if gs, err := c.List(ctx, topic); err != nil || len(gs) != 0 {
		t.Fatalf("List after purge = %v, %v", gs, err)
	}
	// Show still finds a purged record.
	if _, err := c.Show(ctx, topic, dlq.Position{Key: "k1"}); err != nil {
		t.Fatalf("Show after purge: %v", err)
	}
}

// TestReplayToNamedTopic replays to a topic named explicitly: with no tiers
// at all (a plain topic), to a custom-named tier, and to a default-named tier
// 2. The record lands where asked, with its history and the right idem-tier,
// and no default tier topic is ever created.
func TestReplayToNamedTopic(t *testing.T) {
	k := idemtest.Connect(t)
	tests := []struct {
		name     string
		dest     func(t *testing.T, origin string) string
		tier     int
		wantTier int
	}{
		{"no tiers: a plain topic", func(t *testing.T, _ string) string { return k.Topic(t, "plain", 2) }, 0, 1},
		// The tier topics are named under origin: deleted with it.
		{"custom tier name", func(t *testing.T, origin string) string {
			name := origin + ".custom_second_tier"
			k.CreateTopic(t, name, 2)
			return name
		}, 2, 2},
		{"default tier name", func(t *testing.T, origin string) string {
			name := retrytopic.Policy{}.Tier(origin, "billing", 2)
			k.CreateTopic(t, name, 2)
			return name
		}, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			topic, origin := k.Topic(t, "dlq", 2), k.Topic(t, "origin", 2)
			dest := tt.dest(t, origin)
			recs := seedRecords(t, k, topic, origin)
			c := open(t, k)

			now := time.UnixMilli(1_800_000_000_000)
			var allowed []string
			if !strings.HasPrefix(tt.name, "default") {
				// Only the origin and its group's tiers by idem's names are
				// replay targets unless listed.
				_, err := c.Replay(ctx, dlq.ReplayOptions{Topic: topic, To: dest, Filter: dlq.Filter{Key: "k3"}, DropUnmatched: true})
				if !errors.Is(err, forward.ErrReplayTarget) {
					t.Fatalf("Replay to %s, not listed: %v, want a refused target (forward.ErrReplayTarget)", dest, err)
				}
				allowed = []string{dest}
			}
			res, err := c.Replay(ctx, dlq.ReplayOptions{Topic: topic, To: dest, Tier: tt.tier, AllowedTopics: allowed,
				Filter: dlq.Filter{Key: "k3"}, DropUnmatched: true, Now: func() time.Time { return now }})
			if err != nil || res.Replayed != 1 || res.Skipped != 4 {
				t.Fatalf("Replay to %s = %+v, %v", dest, res, err)
			}
			got := readAll(t, k, dest)
			if len(got) != 1 {
				t.Fatalf("%s has %d records, want 1", dest, len(got))
			}
			m := got[0]
			if !bytes.Equal(m.Key, recs[2].key) || !bytes.Equal(m.Value, recs[2].value) || m.Partition != recs[2].origPart {
				t.Errorf("replayed record %q=%q on partition %d, want %q=%q on %d", m.Key, m.Value, m.Partition, recs[2].key, recs[2].value, recs[2].origPart)
			}
			f, ok, err := wire.Decode(m.Headers)
			if err != nil || !ok || f.Tier != tt.wantTier || !f.DueAt.Equal(now) || f.OriginalTopic != origin ||
				f.OriginalOffset != 102 || f.Attempt != 3 || f.Group != "billing" {
				t.Fatalf("headers = %+v, %v, %v; want tier %d due now", f, ok, err, tt.wantTier)
			}
			if len(m.Headers) == 0 || string(m.Headers[0].Key) != "idempotency-key" || string(m.Headers[0].Value) != "idem-3" {
				t.Errorf("original headers not kept first (%d headers)", len(m.Headers))
			}
			if got := readAll(t, k, origin); len(got) != 0 {
				t.Errorf("origin got %d records", len(got))
			}
			assertNoTopic(t, k, retrytopic.Policy{}.Tier(origin, "billing", 1))
		})
	}
}

// TestReplayUnknownDestination: an unknown named destination fails before
// anything is read or committed; with To "", a record whose original topic
// does not exist stops the replay there, and the admin group is not
// committed past it (List still shows it).
func TestReplayUnknownDestination(t *testing.T) {
	k := idemtest.Connect(t)
	ctx := t.Context()
	c := open(t, k)

	t.Run("named", func(t *testing.T) {
		topic, origin := k.Topic(t, "dlq", 2), k.Topic(t, "origin", 2)
		seedRecords(t, k, topic, origin)
		missing := origin + ".missing_tier" // deleted with origin, were it created
		for _, dry := range []bool{true, false} {
			res, err := c.Replay(ctx, dlq.ReplayOptions{Topic: topic, To: missing, DryRun: dry,
				Progress: func(done, total int64) {
					t.Errorf("record read (%d/%d) before the destination was checked", done, total)
				}})
			if !errors.Is(err, dlq.ErrUnknownTopic) || !reflect.DeepEqual(res, dlq.ReplayResult{}) {
				t.Fatalf("Replay(dry run %v) to a missing topic = %+v, %v; want ErrUnknownTopic and nothing done", dry, res, err)
			}
		}
		assertCommitted(t, k, topic, map[int32]int64{0: -1, 1: -1})
		if n := depth(t, c, topic); n != 5 {
			t.Fatalf("Depth = %d, want 5", n)
		}
		assertNoTopic(t, k, missing)
	})

	t.Run("source", func(t *testing.T) {
		topic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
		missing := origin + ".deleted_origin" // deleted with origin, were it created
		for i, o := range []string{origin, missing, origin} {
			f := retrytopic.Failure{OriginalTopic: o, OriginalOffset: int64(i), Group: "billing", Kind: handler.KindPermanent, Error: "boom"}
			k.Produce(t, topic, idemtest.Record{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v"), Headers: headers(wire.Encode([]sarama.RecordHeader(nil), f))})
		}
		res, err := c.Replay(ctx, dlq.ReplayOptions{Topic: topic, DryRun: true})
		if !errors.Is(err, dlq.ErrUnknownTopic) || res.Replayed != 1 {
			t.Fatalf("dry run = %+v, %v; want ErrUnknownTopic after 1", res, err)
		}
		assertCommitted(t, k, topic, map[int32]int64{0: -1})
		// Every destination is checked before anything is sent.
		res, err = c.Replay(ctx, dlq.ReplayOptions{Topic: topic})
		if !errors.Is(err, dlq.ErrUnknownTopic) || res.Replayed != 0 || res.Pending != 3 {
			t.Fatalf("Replay = %+v, %v; want ErrUnknownTopic, nothing sent", res, err)
		}
		assertCommitted(t, k, topic, map[int32]int64{0: -1})
		groups, err := c.List(ctx, topic)
		if err != nil || len(groups) != 1 || groups[0].Count != 3 {
			t.Fatalf("List after the refused replay = %+v, %v; want the 3 records", groups, err)
		}
		if got := readAll(t, k, origin); len(got) != 0 {
			t.Fatalf("origin has %d records, want none", len(got))
		}
		assertNoTopic(t, k, missing)
	})
}

// assertNoTopic fails the test when topic exists.
func assertNoTopic(t *testing.T, k *idemtest.Kafka, topic string) {
	t.Helper()
	topics, err := admin(t, k).ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := topics[topic]; ok {
		t.Fatalf("topic %s was created", topic)
	}
}

// assertCommitted checks the admin group's committed offsets of topic (-1:
// none).
func assertCommitted(t *testing.T, k *idemtest.Kafka, topic string, want map[int32]int64) {
	t.Helper()
	parts := make([]int32, 0, len(want))
	for p := range want {
		parts = append(parts, p)
	}
	resp, err := admin(t, k).ListConsumerGroupOffsets(dlq.AdminGroup(topic), map[string][]int32{topic: parts})
	if err != nil {
		t.Fatal(err)
	}
	for p, w := range want {
		b := resp.GetBlock(topic, p)
		if b == nil || b.Offset != w {
			t.Errorf("admin group offset of %s/%d = %+v, want %d", topic, p, b, w)
		}
	}
}

func TestReplayNoOrigin(t *testing.T) {
	k := idemtest.Connect(t)
	ctx := t.Context()
	topic := k.Topic(t, "dlq", 1)
	k.Produce(t, topic, idemtest.Record{Value: []byte("a")}, idemtest.Record{Value: []byte("b")})
	c := open(t, k)
	_, err := c.Replay(ctx, dlq.ReplayOptions{Topic: topic})
	if !errors.Is(err, dlq.ErrNoOrigin) {
		t.Fatalf("Replay = %v, want ErrNoOrigin", err)
	}
	if n := depth(t, c, topic); n != 2 {
		t.Fatalf("Depth = %d, want 2 (nothing dealt with)", n)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Replay(cctx, dlq.ReplayOptions{Topic: topic}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Replay(cancelled) = %v", err)
	}
}
