package consumer

import (
	"math/rand/v2"
	"testing"
)

// Issue 28, defect 10: transactional ids must not collide across groups
// and instances. "idem-<group>-<instance>" did: group "payments" with
// instance "eu-1" and group "payments-eu" with instance "1" fenced each
// other. Groups are drawn with the characters that made ids ambiguous
// ('-', ':', '+', '.'), instances from Kafka's alphabet for them.
func TestTransactionalIDsDoNotCollide(t *testing.T) {
	a := Config{Group: "payments", InstanceID: "eu-1"}.transactionalID()
	b := Config{Group: "payments-eu", InstanceID: "1"}.transactionalID()
	if a == b {
		t.Fatalf("group payments with instance eu-1 and group payments-eu with instance 1 both have transactional.id %q", a)
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	pick := func(alphabet string, n int) string {
		b := make([]byte, 1+rng.IntN(n))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	seen := map[string]Config{}
	for range 20000 {
		c := Config{Group: pick("ab-:+.", 6)}
		if rng.IntN(4) > 0 {
			c.InstanceID = pick("ab1-._", 5)
		}
		id := c.transactionalID()
		if c.InstanceID == "" {
			continue // random: unique with high probability, not by construction
		}
		if o, ok := seen[id]; ok && (o.Group != c.Group || o.InstanceID != c.InstanceID) {
			t.Fatalf("group %q instance %q and group %q instance %q share transactional.id %q", o.Group, o.InstanceID, c.Group, c.InstanceID, id)
		}
		seen[id] = c
	}
	// A member without an InstanceID never takes the id of one with it.
	for range 200 {
		c := Config{Group: pick("ab-:+.", 6)}
		if o, ok := seen[c.transactionalID()]; ok {
			t.Fatalf("group %q without an instance has the transactional.id of group %q instance %q", c.Group, o.Group, o.InstanceID)
		}
	}
}
