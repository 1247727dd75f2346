package testenv

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// childEnv names the one test a child process started by StartChild runs.
const childEnv = "IDEM_TEST_CHILD"

// Child is the test binary run again as a child process that runs one test
// function: the way idem's tests put a component in a process of its own, so
// they can SIGKILL it at a chosen point. The child test reports where it is
// by printing lines on its stdout (WaitFor reads them) and returns at once
// when InChild says it is not the child.
type Child struct {
	Cmd    *exec.Cmd
	lines  *bufio.Scanner
	stdout io.ReadCloser
	stderr *syncBuffer
}

// StartChild starts the test binary again running only the test named test
// (with -test.count=1), its environment this process's plus env ("KEY=VALUE"
// entries) and the marker InChild looks for. The child's stderr is kept for
// Stderr and logged if tb fails. It is SIGKILLed at tb's cleanup if still
// running.
func StartChild(tb testing.TB, test string, env ...string) *Child {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v")
	cmd.Env = append(append(os.Environ(), childEnv+"="+test), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	c := &Child{Cmd: cmd, lines: bufio.NewScanner(out), stdout: out, stderr: &syncBuffer{}}
	c.lines.Buffer(make([]byte, 0, 64*1024), 1<<20)
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		if tb.Failed() {
			tb.Logf("child %s stderr:\n%s", test, c.Stderr())
		}
	})
	return c
}

// InChild reports whether this process is a child that StartChild started to
// run test.
func InChild(test string) bool { return os.Getenv(childEnv) == test }

// WaitFor reads the child's stdout, line by line, until match accepts one; it
// returns that line and true, or "" and false when the child's stdout ended
// first (it exited).
func (c *Child) WaitFor(match func(line string) bool) (string, bool) {
	for c.lines.Scan() {
		if line := c.lines.Text(); match(line) {
			return line, true
		}
	}
	return "", false
}

// WaitForLine is WaitFor for a line equal to want.
func (c *Child) WaitForLine(want string) bool {
	_, ok := c.WaitFor(func(line string) bool { return line == want })
	return ok
}

// Kill SIGKILLs the child (no deferred code of it runs) and waits for it to
// end. It fails tb, with the child's stderr, unless the child died of that
// signal: a child that had already exited did not reach the point it was to
// be killed at.
func (c *Child) Kill(tb testing.TB) {
	tb.Helper()
	killErr := c.Cmd.Process.Kill()
	_ = c.stdout.Close()
	err := c.Cmd.Wait()
	var ee *exec.ExitError
	if killErr != nil || !errors.As(err, &ee) || ee.ExitCode() != -1 {
		tb.Fatalf("child %s: not killed (kill: %v), ended with %v; stderr:\n%s", c.Cmd.Args[1], killErr, err, c.Stderr())
	}
}

// Wait waits for the child to exit on its own and returns its error, as
// exec.Cmd.Wait does.
func (c *Child) Wait() error {
	_, _ = io.Copy(io.Discard, c.stdout)
	return c.Cmd.Wait()
}

// Stderr returns what the child wrote on its stderr so far.
func (c *Child) Stderr() string { return c.stderr.String() }

// syncBuffer is a strings.Builder safe for the writer goroutine of exec and a
// reader.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
