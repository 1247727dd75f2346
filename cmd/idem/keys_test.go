package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/console/index"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/schema"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// seedSecret writes one dead letter whose value holds a card number and an
// e-mail address at card.number and customer.email, and whose error text,
// stack and a header repeat them.
func seedSecret(t *testing.T, k *idemtest.Kafka, topic, origin string) {
	t.Helper()
	now := time.Now()
	f := retrytopic.Failure{Attempt: 1, OriginalTopic: origin, Group: "billing", Kind: handler.KindPermanent, ErrorType: "*errors.errorString",
		Error: "charge card 4111111111111111 for ann.lee@example.com: declined", Stack: []byte("main.charge(\"ann.lee@example.com\")"),
		FirstFailureAt: now, LastFailureAt: now}
	hs := wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("pay-1")},
		{Key: []byte("x-card"), Value: []byte("4111 1111 1111 1111")}}, f)
	k.Produce(t, topic, idemtest.Record{Key: []byte("pay-1"),
		Value: []byte(`{"id":"pay-1","card":{"number":"4111111111111111"},"customer":{"email":"ann.lee@example.com"}}`), Headers: kitHeaders(hs)})
}

// indexOne makes the failure index's tables in pool's empty schema, indexes
// topic's one record and returns its id.
func indexOne(t *testing.T, k *idemtest.Kafka, pool *pgxpool.Pool, topic string) int64 {
	t.Helper()
	if err := schema.Migrate(testenv.Context(t), pool, nil, nil); err != nil {
		t.Fatal(err)
	}
	indexTopic(t, k, pool, topic, 1)
	var id int64
	if err := pool.QueryRow(context.Background(), `SELECT id FROM idem_dlq_records`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// secrets lists which of seedSecret's secrets s shows.
func secrets(s string) []string {
	var out []string
	for _, sec := range []string{"4111111111111111", "4111 1111 1111 1111", "ann.lee@example.com"} {
		if strings.Contains(s, sec) {
			out = append(out, sec)
		}
	}
	return out
}

// TestCLIMasksInsideText: with --mask card.number --mask customer.email,
// idem dlq show and list never print the card number or the e-mail
// address, not even inside the error text, the stack or a header: from the
// topic or from the index, as a table or as JSON; nor does dlq jobs print
// a card number typed into a job's filter or reason.
func TestCLIMasksInsideText(t *testing.T) {
	k, pool, db, topic, origin := dlqAndEmptySchema(t)
	seedSecret(t, k, topic, origin)
	masks := []string{"--mask", "card.number", "--mask", "customer.email"}
	code, out, _ := idem(t, k, "", "dlq", "show", "-t", topic, "--offset", "0")
	if code != 0 || len(secrets(out)) != 3 {
		t.Fatalf("show without --mask: %d, want all three secrets shown (the test's premise)", code)
	}
	for _, args := range [][]string{
		{"dlq", "show", "-t", topic, "--offset", "0"},
		{"dlq", "show", "-t", topic, "--offset", "0", "--json"},
		{"dlq", "list", "-t", topic},
	} {
		code, out, _ := idem(t, k, "", append(args, masks...)...)
		if code != 0 || len(secrets(out)) > 0 {
			t.Errorf("idem %s: code %d, shows %q", strings.Join(args, " "), code, secrets(out))
		}
	}
	id := indexOne(t, k, pool, topic)
	for _, args := range [][]string{
		{"dlq", "show", "--id", fmt.Sprint(id)},
		{"dlq", "show", "--id", fmt.Sprint(id), "--json"},
		{"dlq", "list", "-t", topic},
		{"dlq", "list", "-t", topic, "--json"},
	} {
		code, out, _ := idem(t, k, "", append(append(args, "--database-url", db), masks...)...)
		if code != 0 || len(secrets(out)) > 0 || !strings.Contains(out, "****") {
			t.Errorf("idem %s (index): code %d, shows %q", strings.Join(args, " "), code, secrets(out))
		}
	}
	// A replay job whose filter and reason hold the card number: dlq jobs
	// does not show it either.
	if code, out, errOut := idem(t, k, "", "dlq", "replay", "--database-url", db, "-t", topic, "--filter", "error~=4111111111111111",
		"--reason", "card 4111 1111 1111 1111 confirmed"); code != 0 {
		t.Fatalf("replay: code %d\n%s%s", code, out, errOut)
	}
	for _, args := range [][]string{{"dlq", "jobs"}, {"dlq", "jobs", "--json"}} {
		code, out, _ := idem(t, k, "", append(append(args, "--database-url", db), masks...)...)
		if code != 0 || len(secrets(out)) > 0 || !strings.Contains(out, "replay") {
			t.Errorf("idem %s: code %d, shows %q\n%s", strings.Join(args, " "), code, secrets(out), out)
		}
	}
	// A mask path that does not parse is an error.
	if code, _, errOut := idem(t, k, "", "dlq", "show", "-t", topic, "--offset", "0", "--mask", "a..b"); code != 1 || !strings.Contains(errOut, "--mask") {
		t.Errorf("bad --mask: %d %s", code, errOut)
	}
}

// keyFile writes a new key-encryption key with idem keys generate.
func keyFile(t *testing.T, k *idemtest.Kafka, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	code, out, _ := idem(t, k, "", "keys", "generate", "--out", path)
	if code != 0 || !strings.Contains(out, "KEK id") {
		t.Fatalf("keys generate: %d %s", code, out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 || strings.Contains(out, strings.TrimSpace(string(b))) {
		t.Fatalf("keys generate: mode %v, or the key printed:\n%s", fi.Mode(), out)
	}
	return path
}

// indexEncrypted runs an indexer with the key of file until n records are
// indexed.
func indexEncrypted(t *testing.T, k *idemtest.Kafka, pool *pgxpool.Pool, topic, file string, n int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ix := &index.Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Group: k.Group(t, "indexer"), Topics: []string{topic}, EncryptionKeyFile: file}
	go func() { done <- ix.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("indexer: %v", err)
		}
	}()
	idemtest.Eventually(t, 60*time.Second, func() error {
		var got int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_dlq_records WHERE key_id IS NOT NULL`).Scan(&got); err != nil || got != n {
			return fmt.Errorf("%d indexed, %v", got, err)
		}
		return nil
	})
}

// TestCLIKeys: the index encrypted with a generated key reads with it and
// says "encrypted" without it; a key file others may read is refused;
// rotation to a new key keeps the record readable under the new key only;
// destroying the data key (with --yes) makes the record "key destroyed" for
// idem dlq show; list shows who destroyed it, and the audit log has both
// actions.
func TestCLIKeys(t *testing.T) {
	k, pool, db, topic, origin := dlqAndEmptySchema(t)
	if err := schema.Migrate(testenv.Context(t), pool, nil, nil); err != nil {
		t.Fatal(err)
	}
	seedSecret(t, k, topic, origin)
	old := keyFile(t, k, "kek")
	if code, _, errOut := idem(t, k, "", "keys", "generate", "--out", old); code != 1 || !strings.Contains(errOut, "exists") {
		t.Errorf("generate over an existing file: %d %s", code, errOut)
	}
	indexEncrypted(t, k, pool, topic, old, 1)
	var id, keyID int64
	if err := pool.QueryRow(context.Background(), `SELECT id, key_id FROM idem_dlq_records`).Scan(&id, &keyID); err != nil {
		t.Fatal(err)
	}
	show := func(key string) (int, string, string) {
		args := []string{"dlq", "show", "--id", fmt.Sprint(id), "--database-url", db}
		if key != "" {
			args = append(args, "--encryption-key-file", key)
		}
		return idem(t, k, "", args...)
	}
	if code, out, _ := show(""); code != 0 || !strings.Contains(out, "encrypted, no key given") || strings.Contains(out, `"card"`) || !strings.Contains(out, "declined") {
		t.Errorf("show without the key: %d\n%s", code, out)
	}
	if code, out, _ := show(old); code != 0 || !strings.Contains(out, `"card": {`) {
		t.Errorf("show with the key: %d\n%s", code, out)
	}
	if err := os.Chmod(old, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := show(old); code != 1 || !strings.Contains(errOut, "chmod 600") {
		t.Errorf("show with a world-readable key file: %d %s", code, errOut)
	}
	if err := os.Chmod(old, 0o600); err != nil {
		t.Fatal(err)
	}

	code, out, _ := idem(t, k, "", "keys", "list", "--database-url", db)
	if code != 0 || !strings.Contains(out, "dlq-index") || !strings.Contains(out, "live") || !strings.Contains(out, "1 data keys") {
		t.Errorf("keys list: %d\n%s", code, out)
	}
	next := keyFile(t, k, "kek.new")
	code, out, _ = idem(t, k, "", "keys", "rotate", "--database-url", db, "--encryption-key-file", old, "--new-key-file", next, "--actor", "alice")
	if code != 0 || !strings.Contains(out, "re-wrapped 1 data keys") {
		t.Fatalf("keys rotate: %d\n%s", code, out)
	}
	if code, out, _ := show(next); code != 0 || !strings.Contains(out, `"card": {`) {
		t.Errorf("show with the new key after rotation: %d\n%s", code, out)
	}
	if code, _, errOut := show(old); code != 1 || !strings.Contains(errOut, "wrong key-encryption key") {
		t.Errorf("show with the retired key: %d %s", code, errOut)
	}

	destroy := []string{"keys", "destroy", "--database-url", db, "--id", fmt.Sprint(keyID), "--reason", "erasure request 77", "--actor", "alice"}
	if code, _, errOut := idem(t, k, "", destroy...); code != 1 || !strings.Contains(errOut, "1 rows") || !strings.Contains(errOut, "--yes") {
		t.Errorf("destroy without --yes: %d %s", code, errOut)
	}
	if code, out, _ := idem(t, k, "", append(destroy, "--yes")...); code != 0 || !strings.Contains(out, "destroyed data key") {
		t.Fatalf("destroy: %d %s", code, out)
	}
	if code, out, _ := show(next); code != 0 || !strings.Contains(out, "key destroyed") || strings.Contains(out, `"card"`) {
		t.Errorf("show after destroy: %d\n%s", code, out)
	}
	if code, out, _ := idem(t, k, "", "keys", "list", "--database-url", db, "--json"); code != 0 || !strings.Contains(out, `"destroyed_by": "alice (os user `) {
		t.Errorf("keys list after destroy: %d\n%s", code, out)
	}
	var acts string
	if err := pool.QueryRow(context.Background(), `SELECT string_agg(action || ' ' || actor, ',' ORDER BY id) FROM idem_dlq_audit`).Scan(&acts); err != nil ||
		!strings.Contains(acts, "key-rotate alice") || !strings.Contains(acts, "key-destroy alice") {
		t.Errorf("audit: %q %v", acts, err)
	}
}
