package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/testing/chaos/check"
	"github.com/idemhq/idem/internal/testing/chaos/draw"
)

// refuseBytes is the DLQ's max.message.bytes after the refuse fault: less
// than the workload's large records dead-lettered whole (a 300 KiB header,
// 100 KB and 300 KB values, 200 KiB of headers), more than any bare stub's
// (key and idem's headers: a panic's carries up to wire.MaxStackBytes of
// stack). A DLQ that refuses even a bare stub is outside what idem
// promises to get past (docs/guarantees.md): the record waits.
const refuseBytes = 16 << 10

// swarmFaults injects a draw's faults.
type swarmFaults struct {
	ctx     context.Context
	svc     *Services
	d       *draw.Draw
	m       *draw.Member
	fl      *fleet
	infra   *sync.RWMutex
	dlq     string // the fallback DLQ (the refuse fault's)
	dir     string
	env     []string
	logf    func(string, ...any)
	log     faultLog
	cluster *clusterFaults // three nodes

	mu       sync.Mutex
	slots    []string // the group's slots
	collider *fleet   // the txn-id-collision fault's group
}

func newSwarmFaults(ctx context.Context, o SwarmOptions, d *draw.Draw, m *draw.Member, fl *fleet, infra *sync.RWMutex, slots []string,
	cfgPath string, env []string, dir, dlq string, logf func(string, ...any)) *swarmFaults {
	s := &swarmFaults{ctx: ctx, svc: o.Services, d: d, m: m, fl: fl, infra: infra, dlq: dlq, dir: dir, env: env, logf: logf, slots: slots}
	if o.Services.nodes() == 3 {
		s.cluster = &clusterFaults{svc: o.Services, rnd: rand.New(rand.NewPCG(d.Spec.Seed, 5)), source: m.Topic, group: m.Group,
			logf: logf, timeout: time.Minute,
			txnID: func(ctx context.Context) (string, string, error) {
				id, who, err := fl.liveTransactionalID(ctx, time.Minute)
				return id, "member " + who, err
			}}
	}
	return s
}

// active is the group's slots.
func (s *swarmFaults) active() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.slots)
}

// slot is the member a fault of target n acts on: one of the live slots.
func (s *swarmFaults) slot(n int) string {
	ss := s.active()
	return ss[n%len(ss)]
}

// run injects f and records it.
func (s *swarmFaults) run(f draw.Fault) error {
	t0 := time.Now()
	s.logf("fault: %s", f.ID)
	var detail, frozen string
	var err error
	if f.Kind == draw.FaultFreeze {
		detail, frozen, err = s.freeze(f)
	} else {
		detail, err = s.do(f)
	}
	end := time.Now()
	if f.Kind == draw.FaultRefuse {
		end = time.Time{} // the DLQ keeps its lower limit: the fault lasts until the run ends
	}
	s.log.add(check.Fault{Kind: f.Kind, Detail: detail, Start: t0, End: end, Member: frozen})
	if err != nil {
		return fmt.Errorf("fault %s: %w", f.ID, err)
	}
	return nil
}

// freeze SIGSTOPs one member past the session timeout, then SIGCONTs it,
// and names the process it stopped ("" when its slot was not running).
func (s *swarmFaults) freeze(f draw.Fault) (detail, member string, err error) {
	fl := s.fl
	fl.membership.Lock()
	defer fl.membership.Unlock()
	slot := s.slot(f.Slot)
	name, ok := fl.signal(slot, syscall.SIGSTOP)
	if !ok {
		return slot + " was not running", "", nil
	}
	d := s.m.SessionTimer.D() + 3*time.Second
	err = sleep(s.ctx, d)
	fl.signal(slot, syscall.SIGCONT)
	return fmt.Sprintf("%s SIGSTOPped for %s (session timeout %s)", name, d, s.m.SessionTimer), name, err
}

func (s *swarmFaults) do(f draw.Fault) (string, error) {
	ctx, fl := s.ctx, s.fl
	switch f.Kind {
	case draw.FaultKill, draw.FaultTerm:
		fl.membership.Lock()
		defer fl.membership.Unlock()
		slot := s.slot(f.Slot)
		if f.Kind == draw.FaultKill {
			name, ok := fl.kill(slot)
			if !ok {
				return slot + " was not running", nil
			}
			_ = sleep(ctx, 500*time.Millisecond)
			return name + " SIGKILLed, " + slot + " restarted", fl.start(slot)
		}
		fl.stop(slot, 40*time.Second)
		return slot + " stopped with SIGTERM (graceful) and restarted", fl.start(slot)
	case draw.FaultJoin:
		s.mu.Lock()
		slot := "m" + strconv.Itoa(len(s.slots)+1)
		s.slots = append(s.slots, slot)
		s.mu.Unlock()
		return slot + " joined the group while it drains", fl.start(slot)
	case draw.FaultPGRestart:
		s.infra.Lock()
		defer s.infra.Unlock()
		return "PostgreSQL stopped -m immediate and started", s.svc.RestartPG(ctx)
	case draw.FaultBrokerRestart:
		if s.svc.nodes() == 3 {
			n := 1 + f.Slot%3
			if err := s.svc.KillNode(ctx, n); err != nil {
				return "", err
			}
			return fmt.Sprintf("node %d SIGKILLed and started", n), s.svc.StartKafka(ctx)
		}
		s.infra.Lock()
		defer s.infra.Unlock()
		if err := s.svc.KillKafka(ctx); err != nil {
			return "", err
		}
		return "broker SIGKILLed and started", s.svc.StartKafka(ctx)
	case draw.FaultTxnAbort:
		id, who, err := fl.liveTransactionalID(ctx, time.Minute)
		if err != nil {
			return "", err
		}
		return "a producer with " + who + "'s transactional.id " + id + " aborted its open transaction", abortTransaction(ctx, s.svc.Brokers(), id)
	case draw.FaultFence:
		slot := s.slot(f.Slot)
		twin := slot + "~twin"
		if err := fl.start(twin); err != nil {
			return "", err
		}
		err := sleep(ctx, 6*time.Second)
		name, _ := fl.kill(twin)
		return fmt.Sprintf("%s ran 6s with %s's InstanceID %s, then SIGKILLed", name, slot, swarmInstanceID(slot)), err
	case draw.FaultRefuse:
		return fmt.Sprintf("%s's max.message.bytes lowered to %d for the rest of the run", s.dlq, refuseBytes), alterTopic(s.svc.Brokers(), s.dlq, "max.message.bytes", strconv.Itoa(refuseBytes))
	case draw.FaultTxnCollide:
		return s.collide(f)
	case draw.FaultLeaderKill:
		s.cluster.found = ""
		err := s.cluster.sourceLeader(ctx)
		return s.cluster.found, err
	case draw.FaultCoordKill:
		s.cluster.found = ""
		err := s.cluster.groupCoordinator(ctx)
		return s.cluster.found, err
	case draw.FaultTxnCoordKill:
		s.cluster.found = ""
		err := s.cluster.txnCoordinator(ctx)
		return s.cluster.found, err
	}
	return "", fmt.Errorf("unknown fault kind %q", f.Kind)
}

// collide runs, for 8 s, a member of another group ("<group>-i", on a topic
// of its own) whose InstanceID makes its transactional.id that of the
// group's member i-<n> ("idem-<group>-i-<n>" both: defect 10).
func (s *swarmFaults) collide(f draw.Fault) (string, error) {
	slot := s.slot(f.Slot)
	n := slot[1:]
	c := draw.Member{Config: draw.Config{Partitions: 1, Members: 1, Attempts: 2, Concurrency: 1, Transactions: true,
		TxnTimeout: s.m.TxnTimeout, InstanceIDs: true, Backoff: s.m.Backoff, SessionTimer: s.m.SessionTimer},
		Topic: s.m.Topic + "-collide", Group: s.m.Group + "-i", T0: s.m.T0}
	if err := createTopicN(s.svc.Brokers(), c.Topic, 1, int16(min(s.svc.nodes(), 3)), nil); err != nil {
		return "", err
	}
	path := filepath.Join(s.dir, "collider.json")
	if err := writeJSON(path, c); err != nil {
		return "", err
	}
	s.mu.Lock()
	if s.collider == nil {
		s.collider = newFleet(s.fl.bin, s.dir, []string{"-config", path}, s.env, s.infra, s.logf)
		s.collider.instanceOf = func(string) string { return n }
	}
	cf := s.collider
	s.mu.Unlock()
	if err := cf.start("c" + n + "~"); err != nil {
		return "", err
	}
	err := sleep(s.ctx, 8*time.Second)
	name, _ := cf.kill("c" + n + "~")
	return fmt.Sprintf("%s of group %s with InstanceID %s (transactional.id idem-%s-%s, %s's) ran 8s", name, c.Group, n, c.Group, n, slot), err
}

// close stops the collider's members.
func (s *swarmFaults) close() {
	s.mu.Lock()
	cf := s.collider
	s.mu.Unlock()
	if cf != nil {
		cf.killAll()
	}
}

// procs are the collider's members.
func (s *swarmFaults) procs(faults []check.Fault) []check.Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.collider == nil {
		return nil
	}
	return s.collider.Procs(faults, errorGrace)
}

// abortTransaction makes a producer with transactional id id: its
// InitProducerId makes the coordinator abort id's open transaction and fence
// the producer that had it (a member's), which must then start anew.
func abortTransaction(ctx context.Context, brokers []string, id string) error {
	cfg := saramaConfig()
	cfg.ClientID = "chaos-txn-abort"
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Transaction.ID = id
	cfg.Net.MaxOpenRequests = 1
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := sarama.NewAsyncProducer(brokers, cfg)
		if err == nil {
			return p.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("init producer id of %s: %w", id, err)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// alterTopic sets topic's config name to value.
func alterTopic(brokers []string, topic, name, value string) error {
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	err = admin.IncrementalAlterConfig(sarama.TopicResource, topic, map[string]sarama.IncrementalAlterConfigsEntry{
		name: {Operation: sarama.IncrementalAlterConfigsOperationSet, Value: &value}}, false)
	if err != nil {
		return fmt.Errorf("set %s's %s to %s: %w", topic, name, value, err)
	}
	return nil
}
