package services

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/testing/testenv"
)

// KAFKA_NODES=3: three combined broker+controller nodes start, each node's
// own metadata lists all three, a topic with replication factor 3 and
// min.insync.replicas=2 is created, written with acks=all and keeps taking
// writes with one node SIGKILLed; `up` restarts that node; `down` stops
// everything.
func TestServicesThreeNodeCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three Kafka nodes")
	}
	began := time.Now()
	state := stateWithJars(t)
	base := testenv.FreePortRange(t, 6)
	run := scriptRunner(t, state, "KAFKA_NODES=3", "KAFKA_PORT="+itoa(base), "KAFKA_CONTROLLER_PORT="+itoa(base+1))
	t.Cleanup(func() { run("down") })
	out := run("up")
	addrs := []string{fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+2), fmt.Sprintf("127.0.0.1:%d", base+4)}
	if want := "KAFKA_BROKERS=" + strings.Join(addrs, ","); !strings.Contains(out, want) {
		t.Fatalf("up printed %q, want %s", out, want)
	}
	t.Logf("three nodes up in %s", time.Since(began).Round(time.Second))

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_0_0_0
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	// A killed leader stays leader until the controller fences it (about
	// 9 s): retry for up to 30 s.
	cfg.Producer.Retry.Max = 120
	cfg.Producer.Retry.Backoff = 250 * time.Millisecond
	for _, a := range addrs {
		b := sarama.NewBroker(a)
		if err := b.Open(cfg); err != nil {
			t.Fatal(err)
		}
		md, err := b.GetMetadata(sarama.NewMetadataRequest(cfg.Version, nil))
		b.Close()
		if err != nil || len(md.Brokers) != 3 {
			t.Fatalf("%s: metadata %v brokers, err %v; want 3", a, md, err)
		}
	}
	client, err := sarama.NewClient(addrs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.CreateTopic("rf3", &sarama.TopicDetail{NumPartitions: 3, ReplicationFactor: 3,
		ConfigEntries: map[string]*string{"min.insync.replicas": new("2")}}, false); err != nil {
		t.Fatal(err)
	}
	// Topic creation is asynchronous: poll until every partition has three in-sync replicas.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ds, err := admin.DescribeTopics([]string{"rf3"})
		ok := err == nil && len(ds) == 1 && ds[0].Err == sarama.ErrNoError && len(ds[0].Partitions) == 3
		for i := 0; ok && i < 3; i++ {
			p := ds[0].Partitions[i]
			ok = len(p.Replicas) == 3 && len(p.Isr) == 3
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rf3 not fully replicated after 30s: %v %+v", err, ds)
		}
		time.Sleep(200 * time.Millisecond) // polling interval
	}
	prod, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	send := func(v string) {
		t.Helper()
		for p := range int32(3) {
			if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: "rf3", Partition: p, Value: sarama.StringEncoder(v)}); err != nil {
				t.Fatalf("send %s to partition %d: %v", v, p, err)
			}
		}
	}
	send("all three up")

	// One node down: min.insync.replicas=2 still takes acks=all writes.
	pid, err := os.ReadFile(filepath.Join(state, "kafka3", "n2", "kafka.pid"))
	if err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("kill", "-9", strings.TrimSpace(string(pid))).Run(); err != nil {
		t.Fatal(err)
	}
	send("node 2 down")
	if out := run("up"); !strings.Contains(out, "starting Kafka node 2") || strings.Contains(out, "node 1 on") {
		t.Fatalf("up after a kill should start node 2 only: %q", out)
	}
	send("node 2 back")

	run("down")
	for n := 1; n <= 3; n++ {
		if _, err := os.Stat(filepath.Join(state, "kafka3", fmt.Sprintf("n%d", n), "kafka.pid")); !os.IsNotExist(err) {
			t.Fatalf("node %d's pid file left after down: %v", n, err)
		}
	}
	if out, _ := exec.Command("pgrep", "-f", "kafka.Kafka "+state).Output(); len(out) > 0 {
		t.Fatalf("broker processes left: %s", out)
	}
	t.Logf("whole test %s", time.Since(began).Round(time.Second))
}
