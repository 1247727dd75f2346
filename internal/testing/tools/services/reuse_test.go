package services

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemhq/idem/internal/testing/testenv"
)

// A second checkout's `up` finds the broker a first checkout started and the
// PostgreSQL that accepts idem's credentials, reuses both (saying so, and
// writing its own services.env), and its `down` leaves them running; the
// first checkout keeps its broker as its own (also with the pid file lost)
// and its `down` still stops it. PostgreSQL is the one the
// tests run against: only reused, never stopped.
func TestServicesReuseAnotherCheckouts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kafka broker")
	}
	pgURL, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if pw, _ := pgURL.User.Password(); pgURL.User.Username() != "idem" || (pw != "idem" && pw != "") || pgURL.Hostname() != "127.0.0.1" {
		t.Fatalf("DATABASE_URL %s: this test reuses the PostgreSQL `make services` starts (user idem on 127.0.0.1)", pgURL.Redacted())
	}
	kport, l1 := freePort(t)
	cport, l2 := freePort(t)
	l1.Close()
	l2.Close()
	ports := []string{"KAFKA_PORT=" + itoa(kport), "KAFKA_CONTROLLER_PORT=" + itoa(cport)}

	owner := stateWithJars(t)
	runOwner := scriptRunner(t, owner, ports...)
	t.Cleanup(func() { runOwner("down") })
	runOwner("up")
	pid := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(owner, "kafka", "kafka.pid")))))

	second := t.TempDir()
	runSecond := scriptRunner(t, second, append(ports, "DATABASE_URL=", "PGPORT="+pgURL.Port())...)
	out := runSecond("up")
	wantEnv := "KAFKA_BROKERS=127.0.0.1:" + itoa(kport) + "\nDATABASE_URL=postgres://idem:idem@127.0.0.1:" + pgURL.Port() + "/idem?sslmode=disable\nSCHEMA_REGISTRY_URL=http://unused\n"
	if !strings.Contains(out, "reusing the Kafka broker already at 127.0.0.1:"+itoa(kport)) ||
		!strings.Contains(out, "reusing the PostgreSQL already at 127.0.0.1:"+pgURL.Port()) || strings.Contains(out, "starting Kafka") {
		t.Fatalf("second checkout's up did not say it reuses both services:\n%s", out)
	}
	if env := string(must(os.ReadFile(filepath.Join(second, "services.env")))); env != wantEnv {
		t.Fatalf("second checkout's services.env = %q, want %q", env, wantEnv)
	}
	if _, err := os.Stat(filepath.Join(second, "kafka", "kafka.pid")); !os.IsNotExist(err) {
		t.Fatalf("second checkout claims a broker of its own: %v", err)
	}

	out = runSecond("down")
	if !strings.Contains(out, "Kafka at 127.0.0.1:"+itoa(kport)+" was not started by this checkout: left running") ||
		!strings.Contains(out, "PostgreSQL at 127.0.0.1:"+pgURL.Port()+" was not started by this checkout: left running") {
		t.Fatalf("second checkout's down did not say it leaves the services running:\n%s", out)
	}
	if err := exec.Command("kill", "-0", pid).Run(); err != nil {
		t.Fatalf("the owner's broker (pid %s) is gone after the second checkout's down: %v", pid, err)
	}
	// Up again in the owner is still a no-op on its own broker.
	if out := runOwner("up"); strings.Contains(out, "reusing") || strings.Contains(out, "starting Kafka") {
		t.Fatalf("owner's second up: %q", out)
	}
	// The owner's broker with its pid file lost (a crash of the script) is
	// the owner's still: kept, not reused.
	if err := os.Remove(filepath.Join(owner, "kafka", "kafka.pid")); err != nil {
		t.Fatal(err)
	}
	if out := runOwner("up"); !strings.Contains(out, "runs without its pid file (pid "+pid+"): keeping it") || strings.Contains(out, "reusing") {
		t.Fatalf("owner's up without its pid file: %q", out)
	}
	if got := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(owner, "kafka", "kafka.pid"))))); got != pid {
		t.Fatalf("pid file says %s after up, want the running broker's %s", got, pid)
	}

	if out := runOwner("down"); !strings.Contains(out, "Kafka stopped") {
		t.Fatalf("owner's down did not stop its broker: %q", out)
	}
	if out, _ := exec.Command("pgrep", "-f", "kafka.Kafka "+owner).Output(); len(out) > 0 {
		t.Fatalf("owner's broker left running after its down: %s", out)
	}
}
