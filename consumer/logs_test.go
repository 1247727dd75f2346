package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
)

// Issue 18 #15: a handler panic is logged at ERROR with its stack, the
// dead-letter at WARN, and Run says when it starts (group, topics, mode,
// tiers) and stops.
func TestPanicAndLifecycleLogs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	var logs logBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.IdempotencyKey == "boom" {
			panic("kaboom")
		}
		return effectHandler()(ctx, m)
	})
	e.produce([]string{"boom", "fine"}, 1)
	r := start(t, cfg, h)
	e.waitEffect("fine", 60*time.Second)
	e.onlyDLQRecord(30 * time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, want := range [][]string{
		{"level=ERROR", "handler panicked", "panic=kaboom", "stack=", "goroutine"},
		{"level=WARN", "dead-lettered", "kind=panic"},
		{"level=INFO", "consumer started", "group=" + e.group, e.topic, "mode=per-message", "tiers="},
		{"level=INFO", "consumer stopped", "group=" + e.group},
	} {
		if !logLine(out, want...) {
			t.Errorf("no log line with %q:\n%s", want, out)
		}
	}
}

// logLine reports whether one line of out contains every part.
func logLine(out string, parts ...string) bool {
next:
	for _, l := range strings.Split(out, "\n") {
		for _, p := range parts {
			if !strings.Contains(l, p) {
				continue next
			}
		}
		return true
	}
	return false
}
