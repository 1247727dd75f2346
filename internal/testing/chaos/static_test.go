package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The group's generation and its rebalances are read from the coordinator's
// log lines, the latest across the nodes.
func TestGenerationFromBrokerLogs(t *testing.T) {
	state := t.TempDir()
	logs := map[int]string{
		1: `[2026-12-01 18:30:54,893] INFO [GroupCoordinator id=1 topic=__consumer_offsets partition=0] Preparing to rebalance group chaos-static in state PreparingRebalance with old generation 0 (reason: Adding new member m1 with group instance id m1; client reason: not provided). (org.apache.kafka.coordinator.group.GroupMetadataManager)
[2026-12-01 18:30:54,900] INFO [GroupCoordinator id=1 topic=__consumer_offsets partition=0] Stabilized group chaos-static generation 1 with 1 members. (org.apache.kafka.coordinator.group.GroupMetadataManager)
[2026-12-01 18:30:55,000] INFO [GroupCoordinator id=1 topic=__consumer_offsets partition=0] Stabilized group chaos-static-other generation 9 with 1 members. (org.apache.kafka.coordinator.group.GroupMetadataManager)`,
		2: `[2026-12-01 18:31:10,100] INFO [GroupCoordinator id=2 topic=__consumer_offsets partition=0] Stabilized group chaos-static generation 3 with 3 members. (org.apache.kafka.coordinator.group.GroupMetadataManager)`,
		3: ``,
	}
	for n, text := range logs {
		d := filepath.Join(state, "kafka3", "n"+string(rune('0'+n)))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "server.log"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	svc := &Services{State: state, Nodes: 3}
	gen, err := generation(svc, "chaos-static")
	if err != nil || gen != 3 {
		t.Fatalf("generation %d, %v; want 3", gen, err)
	}
	n, reasons := rebalances(svc, "chaos-static")
	if n != 1 || !strings.Contains(reasons[0], "Adding new member m1") {
		t.Fatalf("rebalances %d %q; want 1 adding m1", n, reasons)
	}
	if _, err := generation(svc, "chaos-none"); err == nil {
		t.Fatal("a group never stabilized has a generation")
	}
}

// The static run fails on a rebalance or a throughput under half the calm
// one; the dynamic counter-run only on a backlog that ran out.
func TestStaticResultFailed(t *testing.T) {
	ok := StaticResult{Static: true, Calm: 1000, Killed: 600, Kills: 8, GenBefore: 4, GenAfter: 4, LagEnd: 10}
	if f := ok.Failed(); len(f) != 0 {
		t.Fatalf("%v", f)
	}
	for name, r := range map[string]StaticResult{
		"slow":       {Static: true, Calm: 1000, Killed: 400, Kills: 8, GenBefore: 4, GenAfter: 4, LagEnd: 10},
		"rebalanced": {Static: true, Calm: 1000, Killed: 900, Kills: 8, GenBefore: 4, GenAfter: 6, Prepared: 2, LagEnd: 10},
		"drained":    {Static: true, Calm: 1000, Killed: 900, Kills: 8, GenBefore: 4, GenAfter: 4},
	} {
		if len(r.Failed()) == 0 {
			t.Errorf("%s: passed", name)
		}
	}
	dyn := StaticResult{Calm: 1000, Killed: 100, Kills: 8, GenBefore: 4, GenAfter: 20, Prepared: 16, LagEnd: 10}
	if f := dyn.Failed(); len(f) != 0 {
		t.Fatalf("dynamic: %v", f)
	}
}
