package services

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The schema registry: `up` starts it on REGISTRY_PORT and writes
// SCHEMA_REGISTRY_URL; a second `up` is a no-op; another checkout reuses it
// and its `down` leaves it running; the owner's `down` stops it. A port held
// by something that is not a registry is an error naming the port.
func TestServicesRegistry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a schema registry")
	}
	owner := stateWithJars(t)
	if err := os.MkdirAll(filepath.Join(owner, "registry"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(sharedState(t, "registry/dist", "registry-dist"), filepath.Join(owner, "registry", "dist")); err != nil {
		t.Fatal(err)
	}
	rport, l := freePort(t)
	l.Close()
	kafka := os.Getenv("KAFKA_BROKERS")
	if kafka == "" {
		kafka = "127.0.0.1:9092" // unused: Kafka is left alone
	}
	// Kafka is given (left alone); only the registry is started.
	env := []string{"SCHEMA_REGISTRY_URL=", "REGISTRY_PORT=" + itoa(rport), "KAFKA_BROKERS=" + kafka}
	runOwner := func(arg string) string {
		t.Helper()
		return scriptRunner(t, owner, env...)(arg)
	}
	t.Cleanup(func() { runOwner("down") })
	began := time.Now()
	out := runOwner("up")
	want := "SCHEMA_REGISTRY_URL=http://127.0.0.1:" + itoa(rport) + "/apis/ccompat/v7"
	if !strings.Contains(out, want) || !strings.Contains(out, "starting Apicurio Registry") {
		t.Fatalf("up printed %q, want it to start the registry and print %s", out, want)
	}
	t.Logf("registry up in %s", time.Since(began).Round(100*time.Millisecond))
	resp, err := http.Get(strings.TrimPrefix(want, "SCHEMA_REGISTRY_URL=") + "/subjects")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /subjects: %s", resp.Status)
	}
	pid := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(owner, "registry", "registry.pid")))))
	if out := runOwner("up"); strings.Contains(out, "starting Apicurio") || !strings.Contains(out, want) {
		t.Fatalf("second up was not a no-op: %q", out)
	}

	second := t.TempDir()
	runSecond := scriptRunner(t, second, env...)
	if out := runSecond("up"); !strings.Contains(out, "reusing the schema registry already at http://127.0.0.1:"+itoa(rport)) || !strings.Contains(out, want) {
		t.Fatalf("second checkout's up did not reuse the registry: %q", out)
	}
	if out := runSecond("down"); !strings.Contains(out, "was not started by this checkout: left running") {
		t.Fatalf("second checkout's down: %q", out)
	}
	if err := exec.Command("kill", "-0", pid).Run(); err != nil {
		t.Fatalf("the owner's registry (pid %s) is gone after the second checkout's down: %v", pid, err)
	}
	if out := runOwner("down"); !strings.Contains(out, "schema registry stopped") {
		t.Fatalf("owner's down did not stop its registry: %q", out)
	}
	if err := exec.Command("kill", "-0", pid).Run(); err == nil {
		t.Fatalf("registry pid %s still runs after down", pid)
	}

	// A port taken by something else.
	busy, lb := freePort(t)
	t.Cleanup(func() { lb.Close() })
	cmd := exec.Command("bash", filepath.Join(repoRoot(t), "scripts", "services.sh"), "up")
	cmd.Env = append(os.Environ(), "IDEM_STATE="+owner, "DATABASE_URL=postgres://unused", "IDEM_NO_DOCKER=1",
		"KAFKA_BROKERS="+kafka, "SCHEMA_REGISTRY_URL=", "REGISTRY_PORT="+itoa(busy))
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "port "+itoa(busy)+" is already in use") || !strings.Contains(string(b), "does not answer as a schema registry") {
		t.Fatalf("up with the registry port taken: %v %q", err, b)
	}
}
