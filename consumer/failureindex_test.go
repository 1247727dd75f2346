package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemhq/idem/console/index"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestFailureIndexInsideRun: with Config.FailureIndex set (only Pool and a
// Group of the test's own), Run indexes its dead-letter topic: a record the
// handler refuses for good shows up in the failure index, under the
// consumer's DLQ topic and group.
func TestFailureIndexInsideRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.FailureIndex = &index.Indexer{Pool: e.pool, Group: e.group + "-index"}
	start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		return handler.Permanent(errors.New("refused by the test"))
	}))
	e.produce([]string{"poison-1"}, 1)

	store := failidx.NewStore(e.query)
	dlqTopic := cfg.Retry.Tiers.DLQ(e.topic, e.group)
	ctx := testenv.Context(t)
	deadline := time.Now().Add(60 * time.Second)
	for {
		page, err := store.List(ctx, failidx.Filter{Topic: dlqTopic}, "", 10)
		if err == nil && len(page.Records) == 1 {
			r := page.Records[0]
			if r.IdempotencyKey != "poison-1" || r.Group != e.group || r.OriginTopic != e.topic {
				t.Fatalf("indexed record: key %q, group %q, origin %q; want poison-1, %s, %s", r.IdempotencyKey, r.Group, r.OriginTopic, e.group, e.topic)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead-lettered record is not in the failure index after 60 s: page %+v, err %v", page, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the index with a deadline
	}
}
