package consumer_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/testing/testenv"
)

// keysWithDuplicates returns n keys of which about dupFrac repeat earlier ones,
// and the number of distinct keys.
func keysWithDuplicates(n int, dupFrac float64, seed uint64) ([]string, int) {
	r := rand.New(rand.NewPCG(seed, seed))
	keys := make([]string, 0, n)
	uniq := 0
	for i := range n {
		if uniq > 0 && r.Float64() < dupFrac {
			keys = append(keys, keys[r.IntN(len(keys))])
			continue
		}
		keys = append(keys, fmt.Sprintf("key-%d", i))
		uniq++
	}
	return keys, uniq
}

// 1,000 messages, 30% duplicate keys, 6 partitions: exactly the unique
// keys have effects, and every offset is committed.
func TestDuplicatesHaveOneEffect(t *testing.T) {
	t.Parallel()
	forEachMode(t, allModes, func(t *testing.T, mode testMode) {
		e := newEnv(t, 6).in(mode)
		keys, uniq := keysWithDuplicates(1000, 0.3, 1)
		e.produce(keys, 6)
		start(t, e.config(), effectHandler())
		e.waitCommitted(e.topic, 6, 90*time.Second)
		if got := e.count(`SELECT count(*) FROM effects`); got != uniq {
			t.Fatalf("effects = %d, want %d unique keys", got, uniq)
		}
		if got := e.count(`SELECT count(DISTINCT key) FROM effects`); got != uniq {
			t.Fatalf("distinct effect keys = %d, want %d", got, uniq)
		}
		testenv.Eventually(t, 5*time.Second, func() error { return nil })
	})
}
