package consumer

import (
	"slices"
	"strconv"
	"sync"

	"github.com/IBM/sarama"
)

// TopicPartition names one partition of a topic, as passed to
// Config.OnAssigned and Config.OnRevoked.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// String returns "topic/partition".
func (t TopicPartition) String() string { return t.Topic + "/" + strconv.Itoa(int(t.Partition)) }

// lifecycle announces claimed partitions to Config.OnAssigned and
// Config.OnRevoked, and keeps the readiness state.
type lifecycle struct {
	r  *runner
	mu sync.Mutex // held while OnAssigned runs, so no claim of the batch starts before it returns
	// announced are the partitions OnAssigned was called for and whose claim
	// has not ended yet.
	announced map[tp]bool
}

func newLifecycle(r *runner) *lifecycle {
	return &lifecycle{r: r, announced: map[tp]bool{}}
}

// claimStarting runs in a claim's goroutine before its first message. The
// first claim of a rebalance to get here calls OnAssigned with every
// partition of the session not announced yet (all those the rebalance added),
// so one call covers one rebalance; the claims of that batch wait until it
// returns.
func (l *lifecycle) claimStarting(s sarama.ConsumerGroupSession, t tp) {
	l.r.ready.claimed(t, true)
	if l.r.cfg.OnAssigned == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.announced[t] {
		return
	}
	var added []TopicPartition
	for topic, parts := range s.Claims() {
		for _, p := range parts {
			if k := (tp{topic, p}); !l.announced[k] {
				l.announced[k] = true
				added = append(added, TopicPartition{topic, p})
			}
		}
	}
	if !l.announced[t] { // the session's claims moved on already; announce this one
		l.announced[t] = true
		added = append(added, TopicPartition{t.topic, t.partition})
	}
	sortTPs(added)
	l.r.cfg.OnAssigned(l.r.baseCtx, added)
}

// claimEnded runs in a claim's goroutine after its in-flight messages
// finished (or were abandoned past ShutdownGrace): it commits the marked
// offsets synchronously and calls OnRevoked for the partition.
func (l *lifecycle) claimEnded(s sarama.ConsumerGroupSession, t tp) {
	l.r.ready.claimed(t, false)
	if !l.r.claims.claimed(t) { // not claimed again meanwhile
		l.r.claims.forgetLag(t)
	}
	if l.r.cfg.OnAssigned != nil {
		l.mu.Lock()
		delete(l.announced, t)
		l.mu.Unlock()
	}
	if l.r.txn != nil {
		// The partition's offsets, and the forwards of the open transaction,
		// commit before it can move to another member.
		_ = memberTxn{l.r}.commit(s)
	}
	if l.r.cfg.OnRevoked == nil {
		return
	}
	if l.r.txn == nil {
		s.Commit()
	}
	l.r.cfg.OnRevoked(l.r.baseCtx, []TopicPartition{{t.topic, t.partition}})
}

func sortTPs(tps []TopicPartition) {
	slices.SortFunc(tps, func(a, b TopicPartition) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
}

// groupHandler adapts the runner to sarama.ConsumerGroupHandler.
type groupHandler struct {
	r *runner
	// stopCommits ends the session's transaction commits (Transactions).
	stopCommits func()
}

func (g *groupHandler) Setup(s sarama.ConsumerGroupSession) error {
	g.r.log.Debug("idem: session started", "generation", s.GenerationID(), "claims", s.Claims())
	if h := hooksOf(g.r.baseCtx); h != nil && h.session != nil {
		h.session(s)
	}
	if g.r.txn != nil {
		stop, err := memberTxn{g.r}.startCommits(s)
		if err != nil {
			return err
		}
		g.stopCommits = stop
	}
	g.r.shares.rebalanced() // Config.Limits.Breakers: 1/members of the new generation
	g.r.ready.setJoined(true)
	return nil
}

func (g *groupHandler) Cleanup(s sarama.ConsumerGroupSession) error {
	g.r.ready.setJoined(false)
	if g.stopCommits != nil {
		g.stopCommits()
		g.stopCommits = nil
	}
	return nil
}

func (g *groupHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	g.r.m.PartitionsClaimed.WithLabelValues(g.r.cfg.Group).Inc()
	defer g.r.m.PartitionsClaimed.WithLabelValues(g.r.cfg.Group).Dec()
	t := tp{c.Topic(), c.Partition()}
	g.r.life.claimStarting(s, t)
	defer g.r.life.claimEnded(s, t)
	cl := newClaim(g.r, s, c)
	cl.run()
	cl.obs.close()
	return nil
}
