package failidx

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// sealedPool returns a pool with the index's tables and idem_seal_keys, and
// a Sealer of the index's purpose on it under a new KEK.
func sealedPool(t testing.TB) (*pgxpool.Pool, *seal.Sealer) {
	t.Helper()
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	if err := seal.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	kek, err := seal.RandomKEK()
	if err != nil {
		t.Fatal(err)
	}
	sl, err := seal.New(ctx, seal.Config{DB: pool, KEKs: []seal.KEK{kek}, Purpose: Purpose, CacheTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return pool, sl
}

// TestSealedAtRest: with a sealer, Insert stores each value and header
// sealed (the stored bytes hold no plaintext, the row its key id) and takes
// card numbers out of the error text kept in clear; a sealed Store reads
// them back, and a row written before encryption was turned on reads as
// ever; a Store without the key says the payload is encrypted rather than
// failing.
func TestSealedAtRest(t *testing.T) {
	pool, sl := sealedPool(t)
	ctx := testenv.Context(t)
	const topic = "payments.billing.dlq"
	value := []byte(`{"id":"pay-1","card":{"number":"4111111111111111"}}`)
	index(t, pool, 0, dead{Topic: topic, Origin: "payments", Key: "pay-0", Value: []byte(`{"id":"pay-0"}`), Err: "before encryption"})
	if err := InsertSealed(ctx, pool, failidxtest.Messages(1,
		dead{Topic: topic, Origin: "payments", Key: "pay-1", Value: value, Err: "card 4111 1111 1111 1111 declined"},
		dead{Topic: topic, Origin: "payments", Key: "stub-1", Stub: true, Err: "too large"},
	), 1<<20, sl); err != nil {
		t.Fatal(err)
	}

	// At rest: no plaintext, no card number, a key id per sealed row.
	rows, err := pool.Query(ctx, `SELECT dlq_offset, coalesce(key_id, 0), coalesce(value, ''), headers, error FROM idem_dlq_records ORDER BY dlq_offset`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var off, keyID int64
		var v, hs []byte
		var errText string
		if err := rows.Scan(&off, &keyID, &v, &hs, &errText); err != nil {
			t.Fatal(err)
		}
		switch off {
		case 0:
			if keyID != 0 || !bytes.Equal(v, []byte(`{"id":"pay-0"}`)) {
				t.Errorf("the row written in clear: key %d value %q", keyID, v)
			}
		default:
			if keyID == 0 || bytes.Contains(v, []byte("4111")) || bytes.Contains(hs, []byte("idempotency-key")) || bytes.Contains(hs, []byte("4111")) {
				t.Errorf("offset %d at rest: key %d value %q headers %q", off, keyID, v, hs)
			}
			if strings.Contains(errText, "4111") {
				t.Errorf("offset %d: the error kept in clear shows the card number: %q", off, errText)
			}
		}
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}

	sealed := NewStore(pool).Sealed(sl)
	recs := mustList(t, sealed, Filter{Topic: topic})
	if len(recs) != 3 {
		t.Fatalf("%d records", len(recs))
	}
	byKey := map[string]Record{}
	for _, r := range recs {
		byKey[r.IdempotencyKey] = r
		if r.PayloadErr != nil {
			t.Errorf("%s: %v", r.IdempotencyKey, r.PayloadErr)
		}
	}
	got, err := sealed.Get(ctx, byKey["pay-1"].ID)
	if err != nil || !bytes.Equal(got.Value, value) || got.KeyID == 0 || len(got.Headers) == 0 {
		t.Fatalf("Get sealed: %q key %d headers %d, %v", got.Value, got.KeyID, len(got.Headers), err)
	}
	if h := header(got, "idem-error"); h != "card 4111 1111 1111 1111 declined" {
		t.Errorf("the sealed idem-error header keeps the full text: %q", h)
	}
	if s := byKey["stub-1"]; s.Value != nil || !s.Stub || len(s.Headers) == 0 {
		t.Errorf("stub: value %q headers %d", s.Value, len(s.Headers))
	}
	if string(byKey["pay-0"].Value) != `{"id":"pay-0"}` {
		t.Errorf("the row written before encryption: %q", byKey["pay-0"].Value)
	}
	vals, err := sealed.Values(ctx, []int64{byKey["pay-0"].ID, byKey["pay-1"].ID, byKey["stub-1"].ID})
	if err != nil || len(vals) != 2 || !bytes.Equal(vals[byKey["pay-1"].ID], value) {
		t.Errorf("Values: %d values, %v", len(vals), err)
	}

	// Without the key: the record, with its payload said to be encrypted.
	plain, err := NewStore(pool).Get(ctx, byKey["pay-1"].ID)
	if err != nil || !errors.Is(plain.PayloadErr, ErrNoEncryptionKey) || plain.Value != nil || plain.Headers != nil || plain.Error == "" {
		t.Errorf("Get without the key: %+v, %v", plain, err)
	}
}

// header returns the value of r's header key.
func header(r Record, key string) string {
	for _, h := range r.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestSealedTamperDetected: a changed byte of a sealed value, or a sealed
// value moved to another row, is detected: the record reads with PayloadErr
// wrapping seal.ErrTampered, never with wrong bytes.
func TestSealedTamperDetected(t *testing.T) {
	pool, sl := sealedPool(t)
	ctx := testenv.Context(t)
	const topic = "payments.billing.dlq"
	if err := InsertSealed(ctx, pool, failidxtest.Messages(0,
		dead{Topic: topic, Origin: "payments", Key: "pay-0", Value: []byte(`{"amount":10}`), Err: "e"},
		dead{Topic: topic, Origin: "payments", Key: "pay-1", Value: []byte(`{"amount":99}`), Err: "e"},
	), 1<<20, sl); err != nil {
		t.Fatal(err)
	}
	s := NewStore(pool).Sealed(sl)
	if _, err := pool.Exec(ctx, `UPDATE idem_dlq_records SET value = set_byte(value, 20, get_byte(value, 20) # 1) WHERE dlq_offset = 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idem_dlq_records SET headers = (SELECT headers FROM idem_dlq_records WHERE dlq_offset = 0) WHERE dlq_offset = 1`); err != nil {
		t.Fatal(err)
	}
	for _, r := range mustList(t, s, Filter{Topic: topic}) {
		if !errors.Is(r.PayloadErr, seal.ErrTampered) || r.Value != nil || r.Headers != nil {
			t.Errorf("offset %d: value %q, %v; want ErrTampered", r.Offset, r.Value, r.PayloadErr)
		}
	}
}

// sealedPair returns a broker, a sealed index (sealedPool) holding two dead
// letters of dlqTopic sealed at rest, pay-0 and pay-1 (values
// {"payment":"pay-N","amount":10 or 20}), and their origin topic.
func sealedPair(t *testing.T) (k *testenv.Kafka, pool *pgxpool.Pool, sl *seal.Sealer, dlqTopic, origin string) {
	t.Helper()
	k = testenv.NewKafka(t)
	pool, sl = sealedPool(t)
	dlqTopic, origin = k.Topic(t, 1), k.Topic(t, 1)
	if err := InsertSealed(testenv.Context(t), pool, failidxtest.Messages(0,
		dead{Topic: dlqTopic, Origin: origin, Key: "pay-0", Value: []byte(`{"payment":"pay-0","amount":10}`), Err: "e"},
		dead{Topic: dlqTopic, Origin: origin, Key: "pay-1", Value: []byte(`{"payment":"pay-1","amount":20}`), Err: "e"},
	), 1<<20, sl); err != nil {
		t.Fatal(err)
	}
	return k, pool, sl, dlqTopic, origin
}

// TestSealedKeyDestroyed: after its data key is destroyed a record is still
// listed, with PayloadErr wrapping seal.ErrKeyDestroyed and no value; a
// replay of it publishes nothing and says why; an edit is refused; the
// next batch is sealed under a new key and reads. An edit's value is sealed
// at rest too.
func TestSealedKeyDestroyed(t *testing.T) {
	k, pool, sl, dlqTopic, origin := sealedPair(t)
	ctx := testenv.Context(t)
	s := NewStore(pool).Sealed(sl)
	a := NewActions(s, producerClient(t, k))
	recs := mustList(t, s, Filter{Topic: dlqTopic})

	// An edit of one record first: its version is sealed too.
	if res, err := a.EditAndRetry(ctx, "alice", recs[0].ID, []byte(`{"payment":"`+recs[0].IdempotencyKey+`","amount":11}`), "fix"); err != nil || res.Done != 1 {
		t.Fatalf("EditAndRetry: %+v %v", res, err)
	}
	var stored []byte
	var versionKey int64
	if err := pool.QueryRow(ctx, `SELECT value, key_id FROM idem_dlq_versions WHERE record_id = $1`, recs[0].ID).Scan(&stored, &versionKey); err != nil {
		t.Fatal(err)
	}
	if versionKey == 0 || bytes.Contains(stored, []byte("amount")) {
		t.Errorf("edited version at rest: key %d value %q", versionKey, stored)
	}
	got, err := s.Get(ctx, recs[0].ID)
	if err != nil || len(got.Versions) != 1 || !strings.Contains(string(got.Versions[0].Value), `"amount":11`) {
		t.Fatalf("Get with versions: %+v %v", got.Versions, err)
	}

	if err := seal.Destroy(ctx, pool, recs[1].KeyID, "alice", "customer erased"); err != nil {
		t.Fatal(err)
	}
	// One batch, one key: both records (and the edit) go.
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, rec := range recs {
			r, err := s.Get(ctx, rec.ID)
			if err != nil {
				return err
			}
			if !errors.Is(r.PayloadErr, seal.ErrKeyDestroyed) {
				return fmt.Errorf("record %d still readable", r.ID)
			}
			if r.Value != nil || r.Headers != nil || r.IdempotencyKey != rec.IdempotencyKey {
				t.Errorf("after destroy: %+v", r)
			}
			if len(r.Versions) > 0 && (!errors.Is(r.Versions[0].PayloadErr, seal.ErrKeyDestroyed) || r.Versions[0].Value != nil) {
				t.Errorf("after destroy, the edit: %+v", r.Versions[0])
			}
		}
		return nil
	})
	before := len(failidxtest.ReadAll(t, k, origin))
	res, err := a.Replay(ctx, "alice", Selection{IDs: []int64{recs[1].ID}}, "", 0, "retry")
	if err != nil || res.Done != 0 || len(res.Errors) != 1 || !strings.Contains(res.Errors[0], "key destroyed") {
		t.Errorf("Replay of a shredded record: %+v %v", res, err)
	}
	if after := len(failidxtest.ReadAll(t, k, origin)); after != before {
		t.Errorf("Replay published %d records", after-before)
	}
	var verr *ValidationError
	if _, err := a.EditAndRetry(ctx, "alice", recs[1].ID, []byte(`{}`), "fix"); !errors.As(err, &verr) {
		t.Errorf("EditAndRetry of a shredded record: %v, want a ValidationError", err)
	}

	// The next batch gets a new key and reads.
	if err := InsertSealed(ctx, pool, failidxtest.Messages(2,
		dead{Topic: dlqTopic, Origin: origin, Key: "pay-2", Value: []byte(`{"payment":"pay-2"}`), Err: "e"}), 1<<20, sl); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, mustList(t, s, Filter{Topic: dlqTopic, Key: "pay-2"})[0].ID)
	if err != nil || r.PayloadErr != nil || r.KeyID == recs[1].KeyID || string(r.Value) != `{"payment":"pay-2"}` {
		t.Errorf("after destroy, a new row: key %d value %q, %v %v", r.KeyID, r.Value, r.PayloadErr, err)
	}
}

// BenchmarkPageSealed measures what encryption at rest costs a reader:
// one page of 50 records as the console reads it with masking on
// (Store.List, which reads no payload, then Store.Values of the page's
// records, opened when sealed, to mask the error texts) and one record
// (Store.Get), on 5,000 records indexed by Insert in clear and by
// InsertSealed, side by side in one run so the machine's other work weighs
// on both alike. The difference per page, divided by 50, is the cost of
// opening one value.
//
//	go test -run '^$' -bench PageSealed ./internal/failidx
func BenchmarkPageSealed(b *testing.B) {
	const n = 5000
	ds := make([]dead, 0, n)
	for i := range n {
		ds = append(ds, dead{Topic: "payments.billing.dlq", Origin: "payments", Key: fmt.Sprint("pay-", i),
			Value: fmt.Appendf(nil, `{"payment_id":"pay-%d","card":{"number":"4111111111111111"},"note":"%s"}`, i, strings.Repeat("x", 150)),
			Err:   fmt.Sprintf("ledger refused payment pay-%d", i)})
	}
	stores := map[string]*Store{}
	for _, name := range []string{"clear", "sealed"} {
		pool, sl := sealedPool(b)
		if name == "clear" {
			sl = nil
		}
		for start := 0; start < n; start += 500 {
			if err := InsertSealed(testenv.Context(b), pool, failidxtest.Messages(int64(start), ds[start:start+500]...), 1<<20, sl); err != nil {
				b.Fatal(err)
			}
		}
		stores[name] = NewStore(pool).Sealed(sl)
	}
	ctx := testenv.Context(b)
	for _, name := range []string{"clear", "sealed"} {
		s := stores[name]
		page, err := s.List(ctx, Filter{}, "", 50)
		if err != nil || len(page.Records) != 50 || page.Records[0].PayloadErr != nil {
			b.Fatalf("%s: %v", name, err)
		}
		b.Run("list-50/"+name, func(b *testing.B) {
			for b.Loop() {
				p, err := s.List(ctx, Filter{}, "", 50)
				if err != nil {
					b.Fatal(err)
				}
				ids := make([]int64, len(p.Records))
				for i, r := range p.Records {
					ids[i] = r.ID
				}
				if vals, err := s.Values(ctx, ids); err != nil || len(vals) != 50 {
					b.Fatalf("Values: %d, %v", len(vals), err)
				}
			}
		})
		b.Run("get/"+name, func(b *testing.B) {
			for b.Loop() {
				if _, err := s.Get(ctx, page.Records[7].ID); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestSealedListReadsNoPayload: a list page of sealed records reads no
// payload (List selects NULL and empty in their places), so it has nothing
// to open: each record comes back with its key id and no PayloadErr, not
// as "tampered" or "not opened"; Get still opens it.
func TestSealedListReadsNoPayload(t *testing.T) {
	pool, sl := sealedPool(t)
	ctx := testenv.Context(t)
	const topic = "payments.billing.dlq"
	if err := InsertSealed(ctx, pool, failidxtest.Messages(0,
		dead{Topic: topic, Origin: "payments", Key: "pay-0", Value: []byte(`{"amount":10}`), Err: "e"},
		dead{Topic: topic, Origin: "payments", Key: "stub-0", Stub: true, Err: "too large"},
	), 1<<20, sl); err != nil {
		t.Fatal(err)
	}
	s := NewStore(pool).Sealed(sl)
	p, err := s.List(ctx, Filter{Topic: topic}, "", 10)
	if err != nil || len(p.Records) != 2 {
		t.Fatalf("List = %d records, %v", len(p.Records), err)
	}
	for _, r := range p.Records {
		if r.PayloadErr != nil || r.KeyID == 0 || r.Value != nil || len(r.Headers) != 0 {
			t.Errorf("listed %s: key %d value %q headers %d, PayloadErr %v", r.IdempotencyKey, r.KeyID, r.Value, len(r.Headers), r.PayloadErr)
		}
		full, err := s.Get(ctx, r.ID)
		if err != nil || full.PayloadErr != nil || len(full.Headers) == 0 {
			t.Errorf("Get %s: headers %d, PayloadErr %v, %v", r.IdempotencyKey, len(full.Headers), full.PayloadErr, err)
		}
	}
}

// TestSealedJobsPublishOpenedPayloads: a replay job and an edit-and-retry
// job over sealed records, claimed by one process and resumed by another
// (as after a restart), publish the records' opened values and headers
// (the edit's own value, itself sealed at rest), never ciphertext, and
// never refuse a readable record.
func TestSealedJobsPublishOpenedPayloads(t *testing.T) {
	k, pool, sl, dlqTopic, origin := sealedPair(t)
	ctx := testenv.Context(t)
	s := NewStore(pool).Sealed(sl)
	recs := mustList(t, s, Filter{Topic: dlqTopic, Key: "pay-0"})
	recs = append(recs, mustList(t, s, Filter{Topic: dlqTopic, Key: "pay-1"})...)
	client := producerClient(t, k)
	first := NewActions(s, client)
	if _, err := first.StartReplay(ctx, "alice", Selection{IDs: []int64{recs[0].ID}}, "", 0, "retry"); err != nil {
		t.Fatal(err)
	}
	edited := `{"payment":"pay-1","amount":21}`
	if _, err := first.StartEdit(ctx, "alice", recs[1].ID, []byte(edited), "fix"); err != nil {
		t.Fatal(err)
	}
	heir := NewActions(s, client)
	heir.lease = time.Millisecond // first's heartbeat is too old: it stopped
	ids, err := heir.ResumeJobs(ctx)
	if err != nil || len(ids) != 2 {
		t.Fatalf("ResumeJobs = %v, %v", ids, err)
	}
	for _, id := range ids {
		if j, err := heir.RunJob(ctx, id); err != nil || j.Done != 1 {
			t.Errorf("RunJob %d = done %d errors %q, %v", id, j.Done, j.Errors, err)
		}
	}
	got := map[string]string{}
	for _, m := range failidxtest.ReadAll(t, k, origin) {
		ikey, _ := failidxtest.Header(m, "idempotency-key")
		got[ikey] = string(m.Value)
	}
	want := map[string]string{"pay-0": `{"payment":"pay-0","amount":10}`, "pay-1": edited}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("published (by idempotency-key header): %q, want %q", got, want)
	}
}
