package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/control"
)

// The live controls (Config.Controls; internal/control has the tables). A
// member obeys its group's operator pauses and re-drives, which a
// control.Watcher keeps up to date (LISTEN/NOTIFY, and a re-read every 30 s),
// and writes a heartbeat row for the fleet page.
//
//   - A paused partition (its own pause, or its topic's; a retry tier's or
//     deferred topic's partition follows its source topic's pauses) has its
//     fetching paused (idem_partitions_paused{reason="operator"}) and its
//     workers hold: a worker takes no new message (one it took is kept, not
//     handled, and one in the middle of being handled finishes). Offsets
//     stay. Until the first state is read, every claim holds, so a pause
//     holds across restarts and rebalances.
//   - A re-drive of a source topic is run by the member that owns each
//     partition: it holds the partition's workers as for a pause and waits
//     until none has a message in hand, reads the window again from the
//     part's progress (straight from the leader, read_committed), takes each
//     record to its outcome on a worker of its own, and records its progress
//     every second and at the end; then the workers go on. The group's
//     offsets never move back.
//   - Every record is handled under the epoch of the re-drives whose window
//     holds its origin (control.State.Epoch): the re-drive's own reads, the
//     live records of a window not reached yet, a retry tier's or deferred
//     copy, a redelivery. The inbox keys the record by that epoch, so each
//     key of a window runs once more, and a crash anywhere (the progress
//     behind what was handled) only makes duplicates.

// Timings of the live controls.
const (
	beatEvery     = 10 * time.Second       // a heartbeat
	beatGap       = 500 * time.Millisecond // at least this between two beats
	progressEvery = time.Second            // a re-drive's progress row
)

// controlsTiming, carried by Run's ctx (tests only), shortens the beat and
// the watcher's re-read.
type controlsTiming struct{ beat, reread time.Duration }

type controlsTimingKey struct{}

// controls is a member's part in the live controls; nil without
// Config.Controls, and then each method does nothing.
type controls struct {
	r       *runner
	pool    *pgxpool.Pool
	client  sarama.Client
	id      string // this Run's member id
	host    string
	started time.Time
	every   time.Duration
	sources map[string]string // every subscribed topic → its source topic

	state atomic.Pointer[control.State] // nil until the first read
	beat  chan struct{}                 // asks the heartbeat for a beat now

	mu     sync.Mutex
	claims map[tp]*claimCtl
	kmem   string // the group coordinator's member id of this member
}

// startControls starts the live controls when Config.Controls is set: it
// creates their tables, then watches the group's state and beats, on
// watchCtx (wg waits for both).
func (r *runner) startControls(ctx, watchCtx context.Context, wg *sync.WaitGroup, st setup, client sarama.Client) error {
	pool := r.cfg.Controls
	if pool == nil {
		return nil
	}
	if err := st.retry(ctx, nil, "creating the live controls' tables", func() error { return control.Migrate(ctx, pool) }); err != nil {
		return fmt.Errorf("consumer: live controls' tables: %w", err)
	}
	host, _ := os.Hostname()
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	c := &controls{r: r, pool: pool, client: client, host: host, started: time.Now(), every: beatEvery,
		id:      host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(rnd[:]),
		sources: map[string]string{}, beat: make(chan struct{}, 1), claims: map[tp]*claimCtl{}}
	for _, t := range r.cfg.Topics {
		c.sources[t] = t
		for _, tier := range r.rules.TierTopics(t, r.cfg.Group) {
			c.sources[tier] = t
		}
		if r.cfg.Defer != nil {
			c.sources[deferredTopic(t, r.cfg.Group)] = t
		}
	}
	w := &control.Watcher{Pool: pool, Group: r.cfg.Group, Log: r.log, Apply: c.apply}
	if t, ok := ctx.Value(controlsTimingKey{}).(controlsTiming); ok {
		c.every, w.Reread = t.beat, t.reread
	}
	r.ctl = c
	wg.Go(func() { w.Run(watchCtx) })
	wg.Go(func() { c.heartbeat(watchCtx) })
	return nil
}

// apply takes a state the watcher read.
func (c *controls) apply(s control.State) {
	first := c.state.Swap(&s) == nil
	if first {
		c.r.log.Info("idem: live controls read", "pauses", len(s.Pauses), "redrives", len(s.Redrives))
	}
	c.mu.Lock()
	ccs := make([]*claimCtl, 0, len(c.claims))
	for _, cc := range c.claims {
		ccs = append(ccs, cc)
	}
	c.mu.Unlock()
	for _, cc := range ccs {
		cc.update()
	}
	c.kick()
}

// kick asks for a heartbeat now.
func (c *controls) kick() {
	select {
	case c.beat <- struct{}{}:
	default:
	}
}

// epoch returns the replay epoch of the record whose origin is
// topic/partition/offset, and sets msg.Epoch to it (0 without controls).
func (c *controls) epoch(msg *handler.Message, topic string, partition int32, offset int64) int64 {
	if c == nil {
		return 0
	}
	var e int64
	if s := c.state.Load(); s != nil && len(s.Redrives) > 0 {
		e = s.Epoch(topic, partition, offset)
	}
	msg.Epoch = e
	return e
}

// heartbeat writes the member's row every beat and when kicked (claims,
// pauses), at most every beatGap, and deletes it when ctx ends.
func (c *controls) heartbeat(ctx context.Context) {
	t := time.NewTicker(c.every)
	defer t.Stop()
	defer func() {
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := control.Leave(qctx, c.pool, c.r.cfg.Group, c.id); err != nil {
			c.r.log.Debug("idem: live controls: leave the fleet", "err", err)
		}
	}()
	for {
		qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := control.Beat(qctx, c.pool, c.member())
		cancel()
		if err != nil && ctx.Err() == nil {
			c.r.log.Debug("idem: live controls: heartbeat", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.beat:
			if !sleep(ctx, beatGap) { // gather what else changes
				return
			}
		}
	}
}

// member is the member's heartbeat row now.
func (c *controls) member() control.Member {
	c.mu.Lock()
	ccs := make([]*claimCtl, 0, len(c.claims))
	for _, cc := range c.claims {
		ccs = append(ccs, cc)
	}
	kmem := c.kmem
	c.mu.Unlock()
	var st control.Status
	for _, cc := range ccs {
		t := cc.c.tp
		ps := control.PartitionStatus{Topic: t.topic, Partition: t.partition, Lag: -1, Paused: c.r.pauses.why(t)}
		if next, hwm := cc.next.Load(), cc.c.kc.HighWaterMarkOffset(); next >= 0 && hwm >= 0 {
			ps.Lag = max(hwm-next, 0)
		}
		cc.mu.Lock()
		ps.Redrive = cc.redrive
		cc.mu.Unlock()
		st.Partitions = append(st.Partitions, ps)
	}
	slices.SortFunc(st.Partitions, func(a, b control.PartitionStatus) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	if name, since, until, ok := c.r.gate.open(); ok {
		st.Breaker = &control.BreakerStatus{Name: name, Since: since, Until: until}
	}
	return control.Member{Group: c.r.cfg.Group, ID: c.id, InstanceID: c.r.cfg.InstanceID, KafkaMember: kmem, Host: c.host,
		Version: idemVersion(), StartedAt: c.started, BeatEvery: c.every, Status: st}
}

// idemVersion is idem's module version in this binary, with Go's.
func idemVersion() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		const mod = "github.com/idemhq/idem"
		if bi.Main.Path == mod && bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, d := range bi.Deps {
			if d.Path == mod {
				v = d.Version
			}
		}
	}
	return "idem " + v + ", " + runtime.Version()
}
