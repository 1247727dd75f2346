// Package chaos is the fault-injection harness behind `make chaos`: it runs
// its own Kafka broker and PostgreSQL server, the payments example's consumer
// as separate OS processes, a producer of payments and poison records, and a
// schedule of faults (SIGKILLed members, a PostgreSQL restart, a broker
// restart, a broker frozen with SIGSTOP, group resizes); then it gathers the
// history and hands it to package check.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Services are the chaos run's own Kafka broker (or three-node cluster) and
// PostgreSQL server, on ports no other test uses, so that the run may kill,
// restart and freeze them.
type Services struct {
	Root           string // the repository (scripts/services.sh)
	State          string // Kafka's state dir (IDEM_STATE of services.sh)
	KafkaPort      int    // node n's broker port is KafkaPort+2(n-1) with Nodes 3
	ControllerPort int    // node n's controller port is ControllerPort+2(n-1) with Nodes 3
	PGPort         int
	// Nodes is 1 (one broker, the default when 0) or 3 (services.sh's
	// KAFKA_NODES=3: three combined broker+controller nodes, node.id 1…3).
	Nodes int
	Log   func(format string, args ...any)

	pgDir string // PostgreSQL's data and socket dir (outside the repo: the postgres user must reach it)
}

// nodes is Nodes with its default.
func (s *Services) nodes() int { return max(s.Nodes, 1) }

// Brokers are the bootstrap addresses, node 1's first.
func (s *Services) Brokers() []string {
	out := make([]string, s.nodes())
	for i := range out {
		out[i] = s.addr(i + 1)
	}
	return out
}

// addr is node n's broker address.
func (s *Services) addr(n int) string { return fmt.Sprintf("127.0.0.1:%d", s.KafkaPort+2*(n-1)) }

// controllerAddr is node n's controller listener.
func (s *Services) controllerAddr(n int) string {
	return fmt.Sprintf("127.0.0.1:%d", s.ControllerPort+2*(n-1))
}

// pidFile is where services.sh keeps node n's process id.
func (s *Services) pidFile(n int) string {
	if s.nodes() == 1 {
		return filepath.Join(s.State, "kafka", "kafka.pid")
	}
	return filepath.Join(s.State, "kafka3", fmt.Sprintf("n%d", n), "kafka.pid")
}

// DatabaseURL is the URL of database db.
func (s *Services) DatabaseURL(db string) string {
	return fmt.Sprintf("postgres://idem@127.0.0.1:%d/%s?sslmode=disable", s.PGPort, db)
}

// Start starts a fresh broker (its data deleted first; its jars copied from
// the shared state when present) and a fresh PostgreSQL cluster.
func (s *Services) Start(ctx context.Context) error {
	kdir := filepath.Join(s.State, "kafka")
	_ = s.script(ctx, "down") // a broker left by an earlier, crashed run
	for _, d := range []string{"data", "cluster.id", "server.log", "kafka.out"} {
		if err := os.RemoveAll(filepath.Join(kdir, d)); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(filepath.Join(s.State, "kafka3")); err != nil { // the three-node cluster's state
		return err
	}
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		return err
	}
	shared := filepath.Join(s.Root, ".state", "kafka", "libs")
	if _, err := os.Stat(filepath.Join(kdir, "libs", ".stamp")); err != nil {
		if _, err := os.Stat(filepath.Join(shared, ".stamp")); err == nil {
			if out, err := exec.CommandContext(ctx, "cp", "-r", shared, filepath.Join(kdir, "libs")).CombinedOutput(); err != nil {
				return fmt.Errorf("copy the Kafka jars: %v: %s", err, out)
			}
		}
	}
	if err := s.StartKafka(ctx); err != nil {
		return err
	}
	return s.startPG(ctx)
}

// script runs scripts/services.sh for the broker only (DATABASE_URL and
// SCHEMA_REGISTRY_URL set keep it from touching PostgreSQL and from starting
// a schema registry, which no member uses and which would outlive the run on
// the registry's default port).
func (s *Services) script(ctx context.Context, cmd string) error {
	c := exec.CommandContext(ctx, "bash", filepath.Join(s.Root, "scripts", "services.sh"), cmd)
	c.Env = append(os.Environ(), "IDEM_STATE="+s.State, "IDEM_NO_DOCKER=1", "KAFKA_BROKERS=",
		"DATABASE_URL=unused", "SCHEMA_REGISTRY_URL=unused", "KAFKA_PORT="+strconv.Itoa(s.KafkaPort), "KAFKA_CONTROLLER_PORT="+strconv.Itoa(s.ControllerPort),
		"KAFKA_NODES="+strconv.Itoa(s.nodes()))
	out, err := c.CombinedOutput()
	if err != nil {
		return fmt.Errorf("services.sh %s: %w: %s", cmd, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// StartKafka starts the broker, or every node of the cluster that is not
// running (after a kill too), and waits until it answers (with three nodes:
// until each node's metadata lists all three).
func (s *Services) StartKafka(ctx context.Context) error { return s.script(ctx, "up") }

// KafkaPID is the broker's process id (node 1's with three nodes).
func (s *Services) KafkaPID() (int, error) { return s.NodePID(1) }

// NodePID is node n's process id.
func (s *Services) NodePID(n int) (int, error) {
	b, err := os.ReadFile(s.pidFile(n))
	if err != nil {
		return 0, fmt.Errorf("node %d's pid: %w", n, err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// SignalKafka sends sig to the broker (node 1 with three nodes).
func (s *Services) SignalKafka(sig syscall.Signal) error { return s.SignalNode(1, sig) }

// SignalNode sends sig to node n.
func (s *Services) SignalNode(n int, sig syscall.Signal) error {
	pid, err := s.NodePID(n)
	if err != nil {
		return err
	}
	return syscall.Kill(pid, sig)
}

// KillKafka SIGKILLs the broker (node 1 with three nodes) and waits until it
// is gone.
func (s *Services) KillKafka(ctx context.Context) error { return s.KillNode(ctx, 1) }

// KillNode SIGKILLs node n and waits until it is gone.
func (s *Services) KillNode(ctx context.Context, n int) error {
	return s.endNode(ctx, n, syscall.SIGKILL, 0)
}

// StopNode stops node n with SIGTERM (a controlled shutdown: it hands its
// leaderships over first), SIGKILLs it if it is still there after grace,
// and waits until it is gone.
func (s *Services) StopNode(ctx context.Context, n int, grace time.Duration) error {
	return s.endNode(ctx, n, syscall.SIGTERM, grace)
}

func (s *Services) endNode(ctx context.Context, n int, sig syscall.Signal, grace time.Duration) error {
	pid, err := s.NodePID(n)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signal node %d (pid %d): %w", n, pid, err)
	}
	if sig != syscall.SIGKILL {
		gctx, cancel := context.WithTimeout(ctx, grace)
		err := waitGone(gctx, pid)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.Log("node %d (pid %d) still up %s after %s: SIGKILL", n, pid, grace, sig)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if err := waitGone(ctx, pid); err != nil {
		return err
	}
	// A multi-threaded process is a zombie before its last thread has exited
	// and closed its sockets: wait for both of its listeners, the broker's
	// and the controller's (services.sh refuses to start a node on a busy
	// port: a chaos run failed so, under load, on the controller's).
	for _, addr := range []string{s.addr(n), s.controllerAddr(n)} {
		for {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				break
			}
			c.Close()
			if err := sleep(ctx, 100*time.Millisecond); err != nil {
				return err
			}
		}
	}
	// A zombie not reaped yet still answers kill -0: services.sh would take
	// it for a live broker.
	return os.Remove(s.pidFile(n))
}

// waitGone polls until pid no longer exists (a SIGKILLed child of another
// process is reaped by it; services.sh's broker is re-parented to init).
func waitGone(ctx context.Context, pid int) error {
	for {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(b), ") Z ") {
			return nil // a zombie: dead, waiting for its parent
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("process %d still alive: %w", pid, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop stops both servers and deletes PostgreSQL's cluster.
func (s *Services) Stop(ctx context.Context) error {
	err := s.script(ctx, "down")
	if s.pgDir != "" {
		if perr := s.pg(ctx, "pg_ctl", "-D", s.pgData(), "-m", "immediate", "-w", "stop"); perr != nil {
			err = errors.Join(err, perr)
		}
		err = errors.Join(err, os.RemoveAll(s.pgDir))
	}
	return err
}

func (s *Services) pgData() string { return filepath.Join(s.pgDir, "data") }

// pgBin is the newest PostgreSQL server's bin directory.
func pgBin() (string, error) {
	ms, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(ms) == 0 {
		if p, err := exec.LookPath("postgres"); err == nil {
			return filepath.Dir(p), nil
		}
		return "", errors.New("PostgreSQL server not installed (apt-get install postgresql)")
	}
	best := ms[0]
	for _, m := range ms[1:] {
		if version(m) > version(best) {
			best = m
		}
	}
	return filepath.Dir(best), nil
}

func version(p string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
	return n
}

// pg runs a PostgreSQL program, as the postgres user when we are root
// (PostgreSQL refuses to run as root).
func (s *Services) pg(ctx context.Context, prog string, args ...string) error {
	bin, err := pgBin()
	if err != nil {
		return err
	}
	name, argv := filepath.Join(bin, prog), args
	if os.Geteuid() == 0 {
		name, argv = "runuser", append([]string{"-u", "postgres", "--", filepath.Join(bin, prog)}, args...)
	}
	cmd := exec.CommandContext(ctx, name, argv...)
	cmd.Dir = s.pgDir // the postgres user may not enter the repository's directory
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", prog, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startPG creates a cluster in a fresh temporary directory and starts it.
func (s *Services) startPG(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "idem-chaos-pg-")
	if err != nil {
		return err
	}
	s.pgDir = dir
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("running as root needs the postgres user to run PostgreSQL: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return err
		}
	}
	if err := s.pg(ctx, "initdb", "-D", s.pgData(), "-U", "idem", "--auth=trust", "--no-sync"); err != nil {
		return err
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=400 -c shared_buffers=128MB", s.PGPort, dir)
	if err := s.pg(ctx, "pg_ctl", "-D", s.pgData(), "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "-o", opts, "start"); err != nil {
		return err
	}
	s.Log("PostgreSQL on 127.0.0.1:%d (data %s)", s.PGPort, s.pgData())
	return nil
}

// RestartPG stops PostgreSQL the hard way (immediate: no checkpoint, every
// connection cut, crash recovery at start) and starts it again.
func (s *Services) RestartPG(ctx context.Context) error {
	return s.pg(ctx, "pg_ctl", "-D", s.pgData(), "-l", filepath.Join(s.pgDir, "server.log"), "-m", "immediate", "-w", "-t", "60", "restart")
}

// CreateDB creates database name (owned by idem).
func (s *Services) CreateDB(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.DatabaseURL("postgres"))
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}
