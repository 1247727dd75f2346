package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/outbox"
)

// TestOutboxCLI: list --failed shows a failed row with its error, retry
// makes it pending again, and relay publishes it (and the pending row) until
// its context ends.
func TestOutboxCLI(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, schema := testenv.PostgresSchema(t)
	url := schemaURL(t, schema)
	ctx := testenv.Context(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	topic := k.Topic(t, 1)
	missing := testenv.Unique("t_missing")
	t.Cleanup(func() { k.DeleteTopics(t, missing) })
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: topic, Key: []byte("a"), Value: []byte("pending")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var failedID int64
	if err := pool.QueryRow(ctx, `INSERT INTO idem_outbox (topic, key, value, state, attempts, last_error)
		VALUES ($1, 'b', 'was failed', 'failed', 10, 'kafka server: Request was for a topic or partition that does not exist') RETURNING id`,
		missing).Scan(&failedID); err != nil {
		t.Fatal(err)
	}

	code, out, _ := idem(t, k, "", "outbox", "list", "--failed", "--database-url", url)
	if code != 0 || !strings.Contains(out, missing) || !strings.Contains(out, "does not exist") || strings.Contains(out, topic) {
		t.Fatalf("list --failed: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "outbox", "list", "--json", "--database-url", url)
	var rows []struct {
		ID    int64  `json:"id"`
		State string `json:"state"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 2 || rows[1].State != "failed" {
		t.Fatalf("list --json: code %d %+v\n%s", code, rows, out)
	}
	if code, _, errOut := idem(t, k, "", "outbox", "retry", "x1", "--database-url", url); code != 1 || !strings.Contains(errOut, "not an outbox row id") {
		t.Fatalf("retry x1: code %d", code)
	}
	if code, _, _ := idem(t, k, "", "outbox", "list", "--failed", "--state", "pending", "--database-url", url); code != 1 {
		t.Fatalf("contradictory flags accepted")
	}

	k.CreateTopic(t, missing, 1)
	code, out, _ = idem(t, k, "", "outbox", "retry", strconv.FormatInt(failedID, 10), strconv.FormatInt(rows[0].ID, 10), "--database-url", url)
	if code != 0 || !strings.Contains(out, "pending again") || !strings.Contains(out, "left alone") {
		t.Fatalf("retry: code %d\n%s", code, out)
	}

	// relay, in process, until its context ends.
	rctx, cancel := context.WithCancel(ctx)
	var stdout, stderr bytes.Buffer
	a := &app{in: strings.NewReader(""), out: &stdout, errOut: &stderr}
	root := newRootCmd(a)
	root.SetArgs([]string{"--brokers", strings.Join(k.Brokers, ","), "outbox", "relay", "--database-url", url, "--poll-interval", "100ms", "--metrics-addr", "127.0.0.1:0"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(rctx) }()
	if m := readN(t, k, missing, 0, 1); string(m[0].Value) != "was failed" {
		t.Fatalf("retried row published as %q", m[0].Value)
	}
	if m := readN(t, k, topic, 0, 1); string(m[0].Value) != "pending" {
		t.Fatalf("pending row published as %q", m[0].Value)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM idem_outbox").Scan(&n); err != nil || n != 0 {
			return fmt.Errorf("%d rows left (%v)", n, err)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("outbox relay: %v\n%s", err, stderr.String())
	}
}
