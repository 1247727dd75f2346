package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/tables"
)

// TestScheduleList: idem schedule list shows a group's deferred messages in
// due order, as a table and as JSON, and says when there are none.
func TestScheduleList(t *testing.T) {
	t.Parallel()
	k := idemtest.Connect(t)
	pg := idemtest.ConnectPostgres(t) // idem's tables, idem_deferred among them
	pool, db, ctx := pg.Pool, pg.URL, t.Context()
	code, out, _ := idem(t, k, "", "schedule", "list", "--database-url", db)
	if code != 0 || out != "no deferred messages\n" {
		t.Fatalf("empty list: code %d %q", code, out)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	now := time.Now()
	for i, key := range []string{"order-2", "order-1", "\x00bin"} {
		rec := tables.DeferredRecord{Group: "payments", Topic: "payments", Partition: int32(i), Key: []byte(key),
			IdempotencyKey: "pay-" + strings.Trim(key, "\x00"), Origin: handler.Origin{Topic: "payments", Partition: 1, Offset: int64(40 + i)}}
		if i == 2 {
			rec.Group = "audit"
		}
		if err := tables.Defer(ctx, tx, rec, now.Add(time.Duration(2-i)*time.Hour), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	code, out, _ = idem(t, k, "", "schedule", "list", "--database-url", db, "--group", "payments")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") ||
		!strings.Contains(lines[1], "order-1") || !strings.Contains(lines[1], "pay-order-1") || !strings.Contains(lines[1], "payments/1@41") ||
		!strings.Contains(lines[2], "order-2") || strings.Contains(out, "bin") {
		t.Fatalf("list --group payments: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "schedule", "list", "--database-url", db, "--limit", "1", "--json")
	var got struct {
		Deferred []struct {
			Key           *string   `json:"key"`
			KeyHex        string    `json:"key_hex"`
			Group         string    `json:"group"`
			DeferredUntil time.Time `json:"deferred_until"`
		} `json:"deferred"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got.Deferred) != 1 ||
		got.Deferred[0].Group != "audit" || got.Deferred[0].KeyHex != "0062696e" || got.Deferred[0].DeferredUntil.Sub(now).Abs() > time.Second {
		t.Fatalf("list --json --limit 1: code %d %v\n%s", code, err, out)
	}
	if code, _, errOut := idem(t, k, "", "schedule", "list", "--database-url", db, "--limit", "0"); code != 1 || !strings.Contains(errOut, "--limit 0") {
		t.Fatalf("--limit 0: code %d %q", code, errOut)
	}
}
