// Package services tests scripts/services.sh: bad input (each case must end
// within a minute with one line naming the cause and the fix), stale state,
// crash clean-up, the three-node cluster, and the reuse of services another
// checkout started.
package services

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/testing/testenv"
)

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..")
}

// pathWithout returns a PATH folder that has every program of /usr/bin but
// the named ones.
func pathWithout(t *testing.T, drop ...string) string {
	dir := t.TempDir()
	ents, err := os.ReadDir("/usr/bin")
	if err != nil {
		t.Fatal(err)
	}
	skip := map[string]bool{}
	for _, d := range drop {
		skip[d] = true
	}
	for _, e := range ents {
		if skip[e.Name()] {
			continue
		}
		_ = os.Symlink(filepath.Join("/usr/bin", e.Name()), filepath.Join(dir, e.Name()))
	}
	goBin := filepath.Dir(must(exec.LookPath("go")))
	return dir + ":" + goBin
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// kafkaPorts returns a broker and a controller port that were free a moment
// ago, below Linux's ephemeral range (testenv.FreePortRange): a port handed
// out for ":0" and closed is one an outgoing connection may take before
// Kafka binds it.
func kafkaPorts(t *testing.T) (int, int) {
	base := testenv.FreePortRange(t, 2)
	return base, base + 1
}

// freePort returns a port and the listener that holds it.
func freePort(t *testing.T) (int, net.Listener) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l.Addr().(*net.TCPAddr).Port, l
}

// services runs `services.sh up` with a private state folder and free ports.
func services(t *testing.T, env ...string) (string, error) {
	t.Helper()
	// A taken port now costs a build of the readiness probe (a fresh state
	// folder has none) and one probe of up to 5 s, to tell a Kafka broker,
	// which is reused, from anything else: 60 s leaves room on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kport, cport := kafkaPorts(t)
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot(t), "scripts", "services.sh"), "up")
	cmd.Env = append(os.Environ(),
		"IDEM_STATE="+t.TempDir(), "DATABASE_URL=postgres://unused", "SCHEMA_REGISTRY_URL=http://unused", "IDEM_NO_DOCKER=1",
		"KAFKA_PORT="+itoa(kport), "KAFKA_CONTROLLER_PORT="+itoa(cport))
	cmd.Env = append(cmd.Env, env...)
	cmd.Env = append(cmd.Env, "KAFKA_BROKERS=")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("services.sh hung: %s", out)
	}
	return strings.TrimSpace(string(out)), err
}

func itoa(n int) string { return strconv.Itoa(n) }

// scriptRunner returns a function that runs `services.sh ARG` for Kafka only
// (PostgreSQL and the schema registry are left alone, unless env sets
// DATABASE_URL= or SCHEMA_REGISTRY_URL=) with state folder state and env, and
// fails the test if it fails.
func scriptRunner(t *testing.T, state string, env ...string) func(arg string) string {
	script := filepath.Join(repoRoot(t), "scripts", "services.sh")
	return func(arg string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", script, arg)
		cmd.Env = append(os.Environ(), "IDEM_STATE="+state, "DATABASE_URL=postgres://unused", "SCHEMA_REGISTRY_URL=http://unused", "IDEM_NO_DOCKER=1", "KAFKA_BROKERS=")
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("services.sh %s: %v\n%s", arg, err, out)
		}
		return string(out)
	}
}

var jarsMu sync.Mutex

// sharedJars returns the repository's .state/kafka/libs, the Kafka jars
// `make services` fetched; when they are not there (a checkout whose
// `make services` reused another checkout's broker), it fetches them first
// with `services.sh jars`.
func sharedJars(t *testing.T) string { return sharedState(t, "kafka/libs", "jars") }

// sharedState returns the folder dir of the repository's .state holding what
// `make services` fetched (a .stamp file in it says it is complete), fetching
// it first with `services.sh arg` when it is not there.
func sharedState(t *testing.T, dir, arg string) string {
	t.Helper()
	jarsMu.Lock()
	defer jarsMu.Unlock()
	state := filepath.Join(repoRoot(t), ".state")
	path := filepath.Join(state, filepath.FromSlash(dir))
	if _, err := os.Stat(filepath.Join(path, ".stamp")); err == nil {
		return path
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot(t), "scripts", "services.sh"), arg)
	cmd.Env = append(os.Environ(), "IDEM_STATE="+state)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nothing under %s, and services.sh %s failed: %v\n%s", path, arg, err, out)
	}
	return path
}

// stateWithJars is a fresh state folder (IDEM_STATE) whose kafka/libs links
// to the repository's Kafka jars (sharedJars).
func stateWithJars(t *testing.T) string {
	t.Helper()
	state := t.TempDir()
	libs := sharedJars(t)
	if err := os.MkdirAll(filepath.Join(state, "kafka"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(libs, filepath.Join(state, "kafka", "libs")); err != nil {
		t.Fatal(err)
	}
	return state
}

func TestServicesBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("runs scripts/services.sh")
	}
	tests := []struct {
		name string
		env  func(t *testing.T) []string
		want string
	}{
		{"java missing", func(t *testing.T) []string { return []string{"PATH=" + pathWithout(t, "java")} }, "java not found"},
		{"maven missing", func(t *testing.T) []string { return []string{"PATH=" + pathWithout(t, "mvn")} }, "mvn not found"},
		{"port taken by something that is not Kafka", func(t *testing.T) []string {
			p, l := freePort(t)
			t.Cleanup(func() { l.Close() })
			return []string{"KAFKA_PORT=" + itoa(p)}
		}, "which does not answer as a Kafka broker"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := services(t, tt.env(t)...)
			if err == nil {
				t.Fatalf("services.sh up succeeded: %s", out)
			}
			if !strings.Contains(out, tt.want) || strings.Count(out, "\n") != 0 || !strings.HasPrefix(out, "services: ") {
				t.Fatalf("output %q: want one line 'services: …%s…'", out, tt.want)
			}
		})
	}
}

// A stale state folder (broker data without the cluster id beside it) is
// reported with the command that cleans it.
func TestServicesStaleState(t *testing.T) {
	if testing.Short() {
		t.Skip("runs scripts/services.sh")
	}
	state := t.TempDir()
	libs := sharedJars(t)
	if err := os.MkdirAll(filepath.Join(state, "kafka", "data", "__cluster_metadata-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(libs, filepath.Join(state, "kafka", "libs")); err != nil {
		t.Fatal(err)
	}
	out, err := services(t, "IDEM_STATE="+state)
	if err == nil || !strings.Contains(out, "stale Kafka state") || !strings.Contains(out, "CLEAN=1") {
		t.Fatalf("got %v %q, want a stale-state error naming CLEAN=1", err, out)
	}
}

// A broker started by `up`, up again (a no-op), killed with SIGKILL, then
// `down`: nothing is left running and the env file is gone.
func TestServicesIdempotentAndCrashCleanup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kafka broker")
	}
	state := stateWithJars(t)
	kport, cport := kafkaPorts(t)
	run := scriptRunner(t, state, "KAFKA_PORT="+itoa(kport), "KAFKA_CONTROLLER_PORT="+itoa(cport))
	t.Cleanup(func() { run("down") })
	out := run("up")
	want := "KAFKA_BROKERS=127.0.0.1:" + itoa(kport)
	if !strings.Contains(out, want) {
		t.Fatalf("up printed %q, want %s", out, want)
	}
	pid, err := os.ReadFile(filepath.Join(state, "kafka", "kafka.pid"))
	if err != nil {
		t.Fatal(err)
	}
	if out2 := run("up"); strings.Contains(out2, "starting Kafka") || !strings.Contains(out2, want) {
		t.Fatalf("second up was not a no-op: %q", out2)
	}
	if pid2, _ := os.ReadFile(filepath.Join(state, "kafka", "kafka.pid")); string(pid2) != string(pid) {
		t.Fatalf("second up started another broker (pid %s, was %s)", pid2, pid)
	}
	// Crash: the broker dies without the script knowing.
	p := strings.TrimSpace(string(pid))
	if err := exec.Command("kill", "-9", p).Run(); err != nil {
		t.Fatal(err)
	}
	run("down")
	if _, err := os.Stat(filepath.Join(state, "kafka", "kafka.pid")); !os.IsNotExist(err) {
		t.Fatalf("pid file left after down: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "services.env")); !os.IsNotExist(err) {
		t.Fatalf("env file left after down: %v", err)
	}
	if out, _ := exec.Command("pgrep", "-f", "kafka.Kafka "+state).Output(); len(out) > 0 {
		t.Fatalf("broker processes left: %s", out)
	}
	// And up again after the crash works.
	if out := run("up"); !strings.Contains(out, want) {
		t.Fatalf("up after crash printed %q", out)
	}
}
