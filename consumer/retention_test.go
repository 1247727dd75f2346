package consumer_test

import (
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/idemhq/idem/consumer"
)

// TestInboxRetentionShorterThanTopicWarns: an inbox that forgets keys
// sooner than the topic keeps records is named at start, with both numbers.
func TestInboxRetentionShorterThanTopicWarns(t *testing.T) {
	e := newEnv(t, 1)
	twoDays := strconv.Itoa(int((48 * time.Hour).Milliseconds()))
	if err := e.k.Admin(t).AlterConfig(sarama.TopicResource, e.topic, map[string]*string{"retention.ms": &twoDays}, false); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	cfg := e.config()
	cfg.Retention = consumer.RetentionConfig{Keep: time.Hour, NoSweep: true} // swept elsewhere, keeping keys 1h
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.produce([]string{"k"}, 1)
	start(t, cfg, effectHandler())
	e.waitCommitted(e.topic, 1, 60*time.Second)
	out := logs.String()
	if !strings.Contains(out, "inbox forgets keys sooner") || !strings.Contains(out, "inbox_retention=1h0m0s") || !strings.Contains(out, "topic_retention=48h0m0s") {
		t.Errorf("no retention warning naming both numbers; logs:\n%s", out)
	}
}
