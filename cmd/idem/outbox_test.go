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

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/outbox"
)

// outboxEnv is a broker and a schema holding idem's tables (the outbox
// among them), with the database URL of that schema for --database-url.
func outboxEnv(t *testing.T) (*idemtest.Kafka, *pgxpool.Pool, string) {
	t.Helper()
	db := idemtest.ConnectPostgres(t)
	return idemtest.Connect(t), db.Pool, db.URL
}

// TestOutboxCLI: list --failed shows a failed row with its error, retry
// makes it pending again, and relay publishes it (and the pending row) until
// its context ends.
func TestOutboxCLI(t *testing.T) {
	k, pool, url := outboxEnv(t)
	ctx := t.Context()
	topic := k.Topic(t, "orders", 1)
	missing := k.Topic(t, "spare", 1) + ".missing" // created below; deleted with its parent
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
	idemtest.Eventually(t, 10*time.Second, func() error {
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

// TestOutboxListShowsRejectionsAndNotBefore: list prints, in their own
// columns, a row's rejections (apart from its attempts), the NotBefore it
// was delayed to and its next try; --json carries both too.
func TestOutboxListShowsRejectionsAndNotBefore(t *testing.T) {
	k, pool, url := outboxEnv(t)
	ctx := t.Context()
	var now time.Time
	if err := pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	due := now.Add(2 * time.Hour).Truncate(time.Second)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: []byte("delayed"), Value: []byte("v"), NotBefore: due}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idem_outbox (topic, key, value, state, attempts, rejections, last_error)
		VALUES ('orders', 'refused', 'v', 'failed', 12, 7, 'kafka server: Message was too large')`); err != nil {
		t.Fatal(err)
	}

	code, out, _ := idem(t, k, "", "outbox", "list", "--database-url", url)
	if code != 0 {
		t.Fatalf("list: code %d", code)
	}
	lines := strings.Split(out, "\n")
	header, delayed, refused := lines[0], lineWith(t, lines, "delayed"), lineWith(t, lines, "refused")
	// tabwriter aligns cells on the left: a value starts where its heading does.
	at := func(line, heading, want string) {
		t.Helper()
		i := strings.Index(header, heading)
		if i < 0 || !strings.HasPrefix(line[i:], want) {
			t.Errorf("column %s: want %q in\n%s\n%s", heading, want, header, line)
		}
	}
	at(delayed, "NOT BEFORE", due.UTC().Format(time.RFC3339))
	at(delayed, "NEXT TRY", due.UTC().Format(time.RFC3339))
	at(delayed, "REJECTIONS", "0 ")
	at(refused, "ATTEMPTS", "12 ")
	at(refused, "REJECTIONS", "7 ")
	at(refused, "NOT BEFORE", "- ")
	at(refused, "NEXT TRY", "- ")

	code, out, _ = idem(t, k, "", "outbox", "list", "--json", "--database-url", url)
	var rows []struct {
		Key        string     `json:"key"`
		Rejections int        `json:"rejections"`
		NotBefore  *time.Time `json:"not_before"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 2 {
		t.Fatalf("list --json: code %d\n%s", code, out)
	}
	if r := rows[0]; r.Key != "delayed" || r.NotBefore == nil || !r.NotBefore.Equal(due) || r.Rejections != 0 {
		t.Errorf("delayed row: %+v, want not_before %v", r, due)
	}
	if r := rows[1]; r.Key != "refused" || r.NotBefore != nil || r.Rejections != 7 {
		t.Errorf("refused row: %+v, want 7 rejections and no not_before", r)
	}
}

// lineWith returns the first of lines that contains s.
func lineWith(t *testing.T, lines []string, s string) string {
	t.Helper()
	for _, l := range lines {
		if strings.Contains(l, s) {
			return l
		}
	}
	t.Fatalf("no line with %q", s)
	return ""
}
