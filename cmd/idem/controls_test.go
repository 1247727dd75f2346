package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// auditOf returns the newest audit row of action.
func auditOf(t *testing.T, pg *idemtest.Postgres, action string) failidx.AuditEntry {
	t.Helper()
	es, _, err := failidx.NewStore(pg.Pool).Audit(context.Background(), "", 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Action == action {
			return e
		}
	}
	t.Fatalf("no audit row of %s", action)
	return failidx.AuditEntry{}
}

// TestCLIPauseResume: idem pause claims the pause (a second is refused,
// naming who paused), says that no member watches yet, and is audited
// under the OS user with --actor beside it; idem fleet lists it; idem
// resume ends it once.
func TestCLIPauseResume(t *testing.T) {
	k := idemtest.Connect(t)
	pg := idemtest.ConnectPostgres(t)
	args := []string{"--group", "billing", "--topic", "payments", "--partition", "3", "--database-url", pg.URL}
	code, out, _ := idem(t, k, "", append([]string{"pause", "--reason", "ledger migration", "--actor", "bob"}, args...)...)
	if code != 0 || !strings.Contains(out, "paused payments/3 of group billing") || !strings.Contains(out, "Config.Controls") {
		t.Fatalf("pause: code %d\n%s", code, out)
	}
	if a := auditOf(t, pg, "pause"); !strings.HasPrefix(a.Actor, "bob (os user ") || a.Reason != "ledger migration" {
		t.Errorf("the pause's audit row: %+v", a)
	}
	if code, _, errOut := idem(t, k, "", append([]string{"pause", "--reason", "again"}, args...)...); code != 1 || !strings.Contains(errOut, "paused already (by bob") {
		t.Fatalf("a second pause: code %d %s", code, errOut)
	}
	if code, _, errOut := idem(t, k, "", "pause", "--group", "billing", "--topic", "payments", "--database-url", pg.URL); code != 1 || !strings.Contains(errOut, "reason") {
		t.Fatalf("a pause without a reason: code %d %s", code, errOut)
	}
	if code, out, _ := idem(t, k, "", "fleet", "--database-url", pg.URL); code != 0 || !strings.Contains(out, "payments/3") || !strings.Contains(out, "ledger migration") {
		t.Fatalf("fleet: code %d\n%s", code, out)
	}
	if code, out, _ := idem(t, k, "", append([]string{"resume"}, args...)...); code != 0 || !strings.Contains(out, "resumed payments/3 of group billing") {
		t.Fatalf("resume: code %d\n%s", code, out)
	}
	if code, _, errOut := idem(t, k, "", append([]string{"resume"}, args...)...); code != 1 || !strings.Contains(errOut, "not paused") {
		t.Fatalf("a second resume: code %d %s", code, errOut)
	}
}

// TestCLIRedrive: a dry run counts the window and changes nothing; start
// starts it (a second start of the topic is refused while it runs); list
// and show follow it; cancel ends it, audited.
func TestCLIRedrive(t *testing.T) {
	k := idemtest.Connect(t)
	pg := idemtest.ConnectPostgres(t)
	topic := k.Topic(t, "payments", 2)
	for i := range 5 {
		k.Produce(t, topic, idemtest.Record{IdempotencyKey: fmt.Sprint("k-", i), Partition: int32(i % 2)})
	}
	args := []string{"--group", "billing", "--topic", topic, "--from", "1h", "--database-url", pg.URL}
	code, out, _ := idem(t, k, "", append([]string{"redrive", "start", "--dry-run"}, args...)...)
	if code != 0 || !strings.Contains(out, "the window holds 5 records") || !strings.Contains(out, "epoch 1") {
		t.Fatalf("dry run: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", append([]string{"redrive", "start", "--reason", "handler fixed"}, args...)...)
	if code != 0 || !strings.Contains(out, "re-drive 1 started: 5 records") {
		t.Fatalf("start: code %d\n%s", code, out)
	}
	if code, _, errOut := idem(t, k, "", append([]string{"redrive", "start", "--reason", "twice"}, args...)...); code != 1 || !strings.Contains(errOut, "is running") {
		t.Fatalf("a second start: code %d %s", code, errOut)
	}
	if code, out, _ := idem(t, k, "", "redrive", "list", "--database-url", pg.URL); code != 0 || !strings.Contains(out, topic) || !strings.Contains(out, "0/5") {
		t.Fatalf("list: code %d\n%s", code, out)
	}
	if code, out, _ := idem(t, k, "", "redrive", "show", "1", "--database-url", pg.URL); code != 0 || !strings.Contains(out, "re-drive 1: running") || !strings.Contains(out, "PARTITION") {
		t.Fatalf("show: code %d\n%s", code, out)
	}
	if code, out, _ := idem(t, k, "", "redrive", "cancel", "1", "--reason", "wrong window", "--database-url", pg.URL); code != 0 || !strings.Contains(out, "cancelled after 0 of 5") {
		t.Fatalf("cancel: code %d\n%s", code, out)
	}
	if a := auditOf(t, pg, "redrive-cancel"); a.Reason != "wrong window" {
		t.Errorf("the cancel's audit row: %+v", a)
	}
	if code, _, errOut := idem(t, k, "", "redrive", "show", "x", "--database-url", pg.URL); code != 1 || !strings.Contains(errOut, "positive number") {
		t.Fatalf("show x: code %d %s", code, errOut)
	}
}

// TestCLIControlsNeedTheirTables: a database without the controls' tables
// is an error that says to run idem migrate, not a SQL error.
func TestCLIControlsNeedTheirTables(t *testing.T) {
	k := idemtest.Connect(t)
	_, schema := testenv.PostgresSchema(t)
	sep := "?"
	if strings.Contains(testenv.DatabaseURL(t), "?") {
		sep = "&"
	}
	url := testenv.DatabaseURL(t) + sep + "search_path=" + schema
	if code, _, errOut := idem(t, k, "", "fleet", "--database-url", url); code != 1 || !strings.Contains(errOut, "idem migrate") {
		t.Fatalf("fleet on an empty database: code %d %s", code, errOut)
	}
}
