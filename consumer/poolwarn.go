package consumer

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// poolCheckEvery is how often watchPool looks at the claimed partitions.
const poolCheckEvery = time.Second

// watchPool logs a WARN when the partitions this member claims change (at
// start, after each rebalance) and its database pool holds fewer
// connections than its lanes may use at once: every lane of every claimed
// partition, retry tiers and deferred topics included, holds a connection
// for the length of its transaction, and a lane that finds none waits (a
// trial's handler calls took 1–2.5 s on the default pool of 4 with 9
// partitions). With Limits.Adaptive the member-wide limit, at most
// Adaptive.Max, bounds them. The claims are counted once they have held
// still for a look (a rebalance claims and releases partitions one by
// one). Stores whose database is not a *pgxpool.Pool are not checked. It
// returns when ctx is done.
func (r *runner) watchPool(ctx context.Context) {
	pool, ok := orderingDB(r.cfg).(*pgxpool.Pool)
	if !ok || pool == nil {
		return
	}
	size := int(pool.Config().MaxConns)
	t := time.NewTicker(poolCheckEvery)
	defer t.Stop()
	seen, last := -1, -1 // the count at the last look, and at the last check
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		partitions, tiers := 0, 0
		r.claims.parts.Range(func(k, _ any) bool {
			partitions++
			if !slices.Contains(r.cfg.Topics, k.(tp).topic) {
				tiers++
			}
			return true
		})
		if partitions != seen || partitions == last { // moving, or checked already
			seen = partitions
			continue
		}
		last = partitions
		needed := partitions * r.cfg.Concurrency
		if a := r.cfg.Limits.Adaptive; a != nil {
			needed = min(needed, a.Max)
		}
		if needed > size {
			r.log.Warn("idem: the database pool holds fewer connections than this member's lanes may use at once; handler calls wait for a connection (raise the pool's MaxConns, or lower Concurrency)",
				"pool_size", size, "partitions", partitions, "tier_partitions", tiers, "lanes", r.cfg.Concurrency, "needed", needed)
		}
	}
}
