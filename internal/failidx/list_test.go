package failidx

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestListReadsNoPayloads: a list page reads each record's place, failure
// and status, never its value, stack or headers (a page of 50 large
// payloads would otherwise cross from the database for nothing); Get reads
// them.
func TestListReadsNoPayloads(t *testing.T) {
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	index(t, pool, 0, dead{Topic: "orders.billing.dlq", Origin: "orders", Key: "order-1", Value: []byte(`{"id":"order-1"}`), Err: "boom"})
	s := NewStore(pool)
	p, err := s.List(ctx, Filter{}, "", 10)
	if err != nil || len(p.Records) != 1 {
		t.Fatalf("List = %+v, %v", p, err)
	}
	r := p.Records[0]
	if r.Value != nil || len(r.Headers) != 0 || r.Stack != "" {
		t.Errorf("a listed record carries value %q, %d headers, stack %q", r.Value, len(r.Headers), r.Stack)
	}
	if r.ValueSize != len(`{"id":"order-1"}`) || r.Error != "boom" || r.IdempotencyKey != "order-1" {
		t.Errorf("a listed record lacks its fields: %+v", r)
	}
	full, err := s.Get(ctx, r.ID)
	if err != nil || string(full.Value) != `{"id":"order-1"}` || len(full.Headers) == 0 {
		t.Errorf("Get = %+v, %v", full, err)
	}
}

// TestParkedKeysArePagedInSQL: the parked keys come a page at a time, each
// page cut by the query, and the pages together hold every key once.
func TestParkedKeysArePagedInSQL(t *testing.T) {
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	ko := keyorder.New(pool, "billing")
	if err := ko.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		key := []byte(fmt.Sprint("acct-", i))
		if err := ko.BlockTier(ctx, "payments", key, fmt.Sprint("h-", i), 1); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := ko.Park(ctx, keyorder.Record{Topic: "payments", Key: key, IdempotencyKey: fmt.Sprint("p-", i), Offset: int64(i),
				Timestamp: time.Now(), Value: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	a := NewActions(NewStore(pool), nil)
	seen := map[string]int{}
	cursor, pages := "", 0
	for {
		ks, next, err := a.ParkedKeys(ctx, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(ks) > 2 {
			t.Fatalf("a page of 2 holds %d keys", len(ks))
		}
		for _, k := range ks {
			seen[k.Key] = k.Parked
		}
		pages++
		if cursor = next; cursor == "" {
			break
		}
	}
	if pages != 3 || len(seen) != 5 || seen["acct-0"] != 1 || seen["acct-1"] != 0 {
		t.Errorf("%d pages, keys %v; want 3 pages of the 5 keys", pages, seen)
	}
	if _, _, err := a.ParkedKeys(ctx, "not-a-cursor", 2); err == nil {
		t.Error("a bad cursor: no error")
	}
}
