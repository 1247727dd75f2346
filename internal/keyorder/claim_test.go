package keyorder_test

import (
	"errors"
	"testing"

	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// A member that lost its partition to a later claim (a zombie, frozen past
// its session timeout; found by the swarm's soak with a fenced twin: seed
// 1796369855658974460) writes no marked step: its promote, done and owed
// hooks fail with ErrFenced and change nothing, so its successor's next
// commit cannot take a zombie's aborted drain for its own (the key stayed
// blocked behind a head whose forward was aborted, with 21 records behind
// it). The successor's own marks, and unmarked or ownerless steps, pass.
func TestClaimFencesTheEarlierOwner(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	s := keyorder.New(testenv.Postgres(t), "g")
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Claim(ctx, "src", 0, "zombie"); err != nil {
		t.Fatal(err)
	}
	if err := s.Block(ctx, "t", []byte("K"), "m1"); err != nil {
		t.Fatal(err)
	}
	for i, ik := range []string{"m2", "m3"} {
		if st, err := s.Park(ctx, rec(ik, int64(i+2))); err != nil || st != keyorder.Blocked {
			t.Fatalf("Park(%s) = %v, %v", ik, st, err)
		}
	}
	zombie := &keyorder.Mark{Topic: "src", Partition: 0, Offset: 7, Head: "m1", Owner: "zombie"}
	m2, ok, err := s.Next(ctx, "t", []byte("K"), "m1")
	if err != nil || !ok {
		t.Fatalf("Next = %v, %v", ok, err)
	}
	if err := s.Claim(ctx, "src", 0, "successor"); err != nil { // the successor claims while the zombie drains
		t.Fatal(err)
	}
	m2.Tier = 1
	if err := s.PromoteAt(ctx, "m1", m2, zombie); !errors.Is(err, keyorder.ErrFenced) {
		t.Errorf("the zombie's PromoteAt = %v, want ErrFenced", err)
	}
	if err := s.DoneAt(ctx, m2.Seq, zombie); !errors.Is(err, keyorder.ErrFenced) {
		t.Errorf("the zombie's DoneAt = %v, want ErrFenced", err)
	}
	if err := s.OweHooks(ctx, []keyorder.OwedHook{{Key: "h", Mark: *zombie, Payload: []byte("{}")}}); !errors.Is(err, keyorder.ErrFenced) {
		t.Errorf("the zombie's OweHooks = %v, want ErrFenced", err)
	}
	// Nothing changed: m1 is the head, m2 the next parked message, no hook owed.
	if r, ok, err := s.Next(ctx, "t", []byte("K"), "m1"); err != nil || !ok || r.IdempotencyKey != "m2" {
		t.Fatalf("after the fenced steps Next(m1) = %s, %v, %v; want m2", r.IdempotencyKey, ok, err)
	}
	if hs, err := s.ClaimHooks(ctx, keyorder.Committed{Topic: "src", Partition: 0, Offset: 0}); err != nil || len(hs) != 0 {
		t.Fatalf("hooks owed after the fenced OweHooks: %+v, %v", hs, err)
	}
	successor := &keyorder.Mark{Topic: "src", Partition: 0, Offset: 7, Head: "m1", Owner: "successor"}
	if err := s.PromoteAt(ctx, "m1", m2, successor); err != nil {
		t.Fatalf("the successor's PromoteAt: %v", err)
	}
	if err := s.Resolve(ctx, []keyorder.Committed{{Topic: "src", Partition: 0, Offset: 8}}, false); err != nil {
		t.Fatal(err)
	}
	if r, ok, err := s.Next(ctx, "t", []byte("K"), "m2"); err != nil || !ok || r.IdempotencyKey != "m3" {
		t.Fatalf("after the successor's committed promote Next(m2) = %s, %v, %v; want m3", r.IdempotencyKey, ok, err)
	}
	// A mark without an owner (a store used without claims) is not fenced.
	if err := s.DoneAt(ctx, m2.Seq, &keyorder.Mark{Topic: "other", Partition: 3, Offset: 1}); err != nil {
		t.Errorf("DoneAt with an ownerless mark: %v", err)
	}
}
