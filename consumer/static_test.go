package consumer_test

// Static membership (Config.InstanceID, KIP-345): a member SIGKILLed and
// restarted with its InstanceID within the session timeout gets its
// partitions back without a rebalance.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// Environment of the member helper process.
const (
	memberEnvTopic    = "IDEM_MEMBER_TOPIC"
	memberEnvGroup    = "IDEM_MEMBER_GROUP"
	memberEnvSchema   = "IDEM_MEMBER_SCHEMA"
	memberEnvBrokers  = "IDEM_MEMBER_BROKERS"
	memberEnvDB       = "IDEM_MEMBER_DATABASE_URL"
	memberEnvInstance = "IDEM_MEMBER_INSTANCE"
	memberEnvSession  = "IDEM_MEMBER_SESSION_TIMEOUT"
)

// TestMemberHelperProcess is not a test: staticKillTest runs the test binary
// again with only this function (startMember), and SIGKILLs it. It runs
// consumer.Run as one member of the test's group (with the InstanceID of
// IDEM_MEMBER_INSTANCE, possibly empty) writing effects, and prints
// "assigned <n>" each time partitions are assigned to it. Outside that child
// it returns at once.
func TestMemberHelperProcess(t *testing.T) {
	if !testenv.InChild("TestMemberHelperProcess") {
		return
	}
	ctx, pool, session := memberHelperEnv(t)
	var assigned atomic.Int64
	err := consumer.Run(ctx, consumer.Config{
		Brokers:        strings.Split(os.Getenv(memberEnvBrokers), ","),
		Group:          os.Getenv(memberEnvGroup),
		Topics:         []string{os.Getenv(memberEnvTopic)},
		InstanceID:     os.Getenv(memberEnvInstance),
		Dedupe:         dedupe.NewPostgres(pool),
		Sarama:         staticSarama(session),
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		CommitInterval: 100 * time.Millisecond,
		ShutdownGrace:  5 * time.Second,
		OnAssigned: func(_ context.Context, tps []consumer.TopicPartition) {
			fmt.Printf("assigned %d\n", assigned.Add(int64(len(tps))))
		},
		OnRevoked: func(_ context.Context, tps []consumer.TopicPartition) {
			fmt.Printf("assigned %d\n", assigned.Add(-int64(len(tps))))
		},
	}, effectHandler())
	t.Fatalf("member helper: Run returned %v before it was killed", err)
}

// memberHelperEnv is what a member helper process runs with, from its
// environment: a ctx that ends after 5 minutes (a safety net: the parent
// kills it long before), a pool on the test's schema and the session
// timeout.
func memberHelperEnv(t *testing.T) (context.Context, *pgxpool.Pool, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	pcfg, err := pgxpool.ParseConfig(os.Getenv(memberEnvDB))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(memberEnvSchema)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	session, err := time.ParseDuration(os.Getenv(memberEnvSession))
	if err != nil {
		t.Fatal(err)
	}
	return ctx, pool, session
}

func staticSarama(session time.Duration) *sarama.Config {
	c := sarama.NewConfig()
	c.Version = testenv.KafkaVersion
	c.Consumer.Group.Session.Timeout = session
	c.Consumer.Group.Heartbeat.Interval = time.Second
	return c
}

// startMember starts the member helper process with its InstanceID and
// session timeout.
func (e *env) startMember(instance string, session time.Duration) *testenv.Child {
	e.t.Helper()
	return testenv.StartChild(e.t, "TestMemberHelperProcess", e.memberEnv(instance, session)...)
}

// memberEnv is the member helper's environment for e (also the
// transactional member helper's).
func (e *env) memberEnv(instance string, session time.Duration) []string {
	return []string{memberEnvTopic + "=" + e.topic, memberEnvGroup + "=" + e.group,
		memberEnvSchema + "=" + e.coreSchema(), memberEnvBrokers + "=" + strings.Join(e.k.Brokers, ","),
		memberEnvDB + "=" + testenv.DatabaseURL(e.t), memberEnvInstance + "=" + instance, memberEnvSession + "=" + session.String()}
}

// waitAssigned waits until the member helper c says it holds want
// partitions.
func waitAssigned(t *testing.T, c *testenv.Child, want int, timeout time.Duration) {
	t.Helper()
	line := fmt.Sprintf("assigned %d", want)
	if _, err := c.WaitForWithin(timeout, func(l string) bool { return l == line }); err != nil {
		t.Fatalf("member helper not assigned %d partitions: %v; its log:\n%s", want, err, c.Output())
	}
}

// generations follows the sessions of the in-process members.
type generations struct {
	mu       sync.Mutex
	sessions map[string][]sarama.ConsumerGroupSession // by member name, in start order
}

func (g *generations) hook(ctx context.Context, name string) context.Context {
	return consumer.WithSessionHook(ctx, func(s sarama.ConsumerGroupSession) {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.sessions[name] = append(g.sessions[name], s)
	})
}

// current returns each member's latest session count and generation.
func (g *generations) current() map[string][2]int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string][2]int32{}
	for name, ss := range g.sessions {
		out[name] = [2]int32{int32(len(ss)), ss[len(ss)-1].GenerationID()}
	}
	return out
}

// staticKillTest runs 3 members on 12 partitions: two in this process and a
// child process SIGKILLed and restarted kills times, every 5 s, all with
// an InstanceID when static. It returns the in-process members' (sessions,
// generation) before the first kill and after the last restart, and checks
// that every message was applied exactly once.
func staticKillTest(t *testing.T, static bool, kills int, session time.Duration) (before, after map[string][2]int32) {
	const partitions, perRound = 12, 240
	e := newEnv(t, partitions)
	gens := &generations{sessions: map[string][]sarama.ConsumerGroupSession{}}
	regs := map[string]*prometheus.Registry{}
	for _, name := range []string{"member-a", "member-b"} {
		cfg := e.config()
		cfg.Sarama = staticSarama(session)
		cfg.Registerer = prometheus.NewRegistry()
		regs[name] = cfg.Registerer.(*prometheus.Registry)
		if static {
			cfg.InstanceID = name
		}
		startCtx(t, gens.hook(testenv.Context(t), name), cfg, effectHandler())
	}
	instance := ""
	if static {
		instance = "member-c"
	}
	total := 0
	produce := func() {
		e.produce(coreKeys(fmt.Sprintf("static-%d", total), perRound), partitions)
		total += perRound
	}
	produce()
	// The group is settled when the child holds its share and the two
	// others hold the rest.
	child := e.startMember(instance, session)
	waitAssigned(t, child, partitions/3, 90*time.Second)
	testenv.Eventually(t, 60*time.Second, func() error {
		a, b := coreClaimed(t, regs["member-a"]), coreClaimed(t, regs["member-b"])
		if a != partitions/3 || b != partitions/3 {
			return fmt.Errorf("in-process members claim %d and %d partitions, waiting for %d each", a, b, partitions/3)
		}
		return nil
	})
	before = gens.current()
	for i := range kills {
		child.Kill(t) // no LeaveGroup, no commit
		produce()
		child = e.startMember(instance, session)
		waitAssigned(t, child, partitions/3, 90*time.Second)
		if i < kills-1 {
			// The cadence of the kills, not a synchronisation.
			select {
			case <-time.After(5 * time.Second):
			case <-testenv.Context(t).Done():
				return
			}
		}
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		a, b := coreClaimed(t, regs["member-a"]), coreClaimed(t, regs["member-b"])
		if a != partitions/3 || b != partitions/3 {
			return fmt.Errorf("in-process members claim %d and %d partitions, waiting for %d each", a, b, partitions/3)
		}
		return nil
	})
	after = gens.current()
	e.coreWaitEffects(total, 120*time.Second)
	e.coreAssertOnePerKey(total)
	return before, after
}

// TestStaticMemberRestartKeepsGeneration: one of three static members is
// SIGKILLed and restarted every 5 s; the other two never see a rebalance
// (their session and generation stay put), and every message is applied
// once.
func TestStaticMemberRestartKeepsGeneration(t *testing.T) {
	t.Parallel()
	before, after := staticKillTest(t, true, 4, 30*time.Second)
	t.Logf("in-process members (sessions, generation): before the kills %v, after %v", before, after)
	for name, b := range before {
		if a := after[name]; a != b {
			t.Errorf("%s: (sessions, generation) went from %v to %v across the kills: a static member's restart rebalanced the group", name, b, a)
		}
	}
}

// TestDynamicMemberRestartRebalances is the counter-test: without
// InstanceID, the same kill and restart moves the other members to a new
// generation, so TestStaticMemberRestartKeepsGeneration's assertion can
// fail.
func TestDynamicMemberRestartRebalances(t *testing.T) {
	t.Parallel()
	before, after := staticKillTest(t, false, 1, 10*time.Second)
	t.Logf("in-process members (sessions, generation): before the kill %v, after %v", before, after)
	for name, b := range before {
		if a := after[name]; a == b {
			t.Errorf("%s: (sessions, generation) stayed %v across a dynamic member's restart: the generation is not observed", name, b)
		}
	}
}
