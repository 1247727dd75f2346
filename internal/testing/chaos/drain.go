package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/testing/chaos/check"
)

// This file is how a run waits out its backlog once the faults are over:
// drain waits until every group has committed every record of its topics
// and the outbox and the stores are empty, and leftOver measures what is
// left (the lags the checker's noLag invariant reads).

// lagSource is a group and the topics it reads.
type lagSource struct {
	group  string
	topics []string
}

// stores are the tables besides the outbox that must be empty at the end.
type stores struct {
	ordering bool // the ordering store (Ordering ByKey): heads and parked messages
	deferred bool // the deferred messages (Config.Defer) not yet published
}

// drain waits until every group has committed every record of its topics,
// the outbox is empty and the stores hold nothing of the group; stable
// over three polls a second apart. timeout is how long it may go without
// progress (drainLoop).
func drain(ctx context.Context, brokers []string, pool *pgxpool.Pool, sources []lagSource, st stores, timeout time.Duration) error {
	return drainLoop(ctx, func() (int64, int64, error) {
		lags, err := leftOver(ctx, brokers, pool, sources, st)
		left, done := int64(0), int64(0)
		for _, l := range lags {
			left += l.End - max(l.Committed, 0)
			done += max(l.Committed, 0)
		}
		return left, done, err
	}, timeout, drainCap*timeout, time.Second)
}

// drainCap bounds a drain that keeps making progress: at most this many
// times its stall timeout. With Transactions, every record a destination
// refuses costs an aborted transaction and a new session per form (a few
// seconds each), and with Ordering its key waits through them: swarm-ci's
// seed 1796364139352738188 (34 records too large for both retry.1 and the
// DLQ, one hot key) was still draining, a refusal every 5 s, when a cap of
// 4 ended it after 6 minutes.
const drainCap = 8

// drainLoop polls probe every tick until it reports nothing left three
// times in a row. probe returns what is left (records not committed, rows
// left in the stores) and how far the group got (its committed offsets
// summed). A drain fails when it made no progress (less left than ever
// before, or committed further) for stall, or when it ran longer than cap:
// a group working through a long serial chain (one hot key, ordered,
// through every tier) drains slowly but is not stalled, and must not be
// reported as lag.
func drainLoop(ctx context.Context, probe func() (left, committed int64, err error), stall, cap, tick time.Duration) error {
	begin := time.Now()
	lastProgress := begin
	bestLeft, bestDone := int64(-1), int64(-1)
	stable := 0
	var last string
	for stable < 3 {
		now := time.Now()
		if now.Sub(lastProgress) > stall {
			return fmt.Errorf("not drained: no progress for %s (%s)", stall, last)
		}
		if now.Sub(begin) > cap {
			return fmt.Errorf("not drained after %s: %s", cap, last)
		}
		left, done, err := probe()
		switch {
		case err != nil:
			stable, last = 0, err.Error()
		case left > 0:
			stable, last = 0, fmt.Sprintf("%d left", left)
		default:
			stable++
		}
		if err == nil {
			if bestLeft < 0 || left < bestLeft || done > bestDone {
				lastProgress = time.Now()
			}
			if bestLeft < 0 || left < bestLeft {
				bestLeft = left
			}
			bestDone = max(bestDone, done)
		}
		if err := sleep(ctx, tick); err != nil {
			return err
		}
	}
	return nil
}

// leftOver is the lag of every source, plus the unpublished outbox rows and
// the rows of the stores st names, as pseudo-partitions.
func leftOver(ctx context.Context, brokers []string, pool *pgxpool.Pool, sources []lagSource, st stores) ([]check.Lag, error) {
	var all []check.Lag
	for _, s := range sources {
		lags, err := lagsOf(brokers, s.group, s.topics)
		if err != nil {
			return nil, err
		}
		all = append(all, lags...)
	}
	n, err := outboxLeft(ctx, pool)
	if err != nil {
		return nil, err
	}
	all = append(all, check.Lag{Topic: "outbox (rows not published)", End: n})
	if st.ordering {
		n, err := parkedCount(ctx, pool, sources[0].group)
		if err != nil {
			return nil, err
		}
		all = append(all, check.Lag{Topic: "ordering store (heads + parked)", End: n})
	}
	if st.deferred {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_deferred WHERE consumer_group = $1`, sources[0].group).Scan(&n); err != nil {
			return nil, err
		}
		all = append(all, check.Lag{Topic: "deferred store (not yet published)", End: n})
	}
	return all, nil
}

// parkedCount is the ordering store's heads and parked messages of group.
func parkedCount(ctx context.Context, pool *pgxpool.Pool, group string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idem_ordering_heads WHERE consumer_group = $1)
		+ (SELECT count(*) FROM idem_ordering_parked WHERE consumer_group = $1)`, group).Scan(&n)
	return n, err
}

// lagsOf is the group's committed offset and the end of each partition of
// topics (topics that do not exist are skipped: a tier nobody needed).
func lagsOf(brokers []string, group string, topics []string) ([]check.Lag, error) {
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, err
	}
	existing, err := client.Topics()
	if err != nil {
		return nil, err
	}
	req := map[string][]int32{}
	ends := map[string]map[int32]int64{}
	for _, t := range topics {
		if !slices.Contains(existing, t) {
			continue
		}
		ps, err := client.Partitions(t)
		if err != nil {
			return nil, err
		}
		ends[t] = map[int32]int64{}
		for _, p := range ps {
			end, err := client.GetOffset(t, p, sarama.OffsetNewest)
			if err != nil {
				return nil, err
			}
			ends[t][p] = end
			req[t] = append(req[t], p)
		}
	}
	resp, err := admin.ListConsumerGroupOffsets(group, req)
	if err != nil {
		return nil, err
	}
	var lags []check.Lag
	for _, t := range topics {
		for _, p := range req[t] {
			l := check.Lag{Topic: t, Partition: p, End: ends[t][p], Committed: -1}
			if b := resp.GetBlock(t, p); b != nil {
				l.Committed = b.Offset
			}
			// A transactional run's logs end with markers (and maybe
			// aborted records) a consumer never commits past.
			l.End = settledEnd(client, t, p, l.Committed, l.End)
			lags = append(lags, l)
		}
	}
	return lags, nil
}
