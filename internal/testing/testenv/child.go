package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// childEnv names the one test a child process started by StartChild runs.
const childEnv = "IDEM_TEST_CHILD"

// Child is the test binary run again as a child process that runs one test
// function: the way idem's tests put a component in a process of its own, so
// they can SIGKILL it at a chosen point. The child test reports where it is
// by printing lines on its stdout (WaitFor reads them) and returns at once
// when InChild says it is not the child.
type Child struct {
	// Cmd is the child's command, started: signal its Process directly
	// (SIGSTOP, SIGCONT) when Kill and Stop do not fit.
	Cmd *exec.Cmd
	// Stdin is the child's stdin, for a child that waits for the parent's
	// word; closed when the child has exited.
	Stdin io.WriteCloser

	test   string
	done   chan struct{} // closed once Cmd.Wait returned: every line is in lines
	err    error         // Cmd.Wait's, set before done is closed
	output syncBuffer    // stdout and stderr as they came
	stderr syncBuffer
	lines  lineBuffer // stdout, by line
	read   int        // lines WaitFor has looked at
}

// StartChild starts the test binary again running only the test named test
// (with -test.count=1), its environment this process's plus env ("KEY=VALUE"
// entries) and the marker InChild looks for. Its stdout and stderr are kept
// (Output, Stderr; stdout by line for WaitFor) and logged if tb fails. It is
// SIGKILLed and waited for at tb's cleanup if still running.
func StartChild(tb testing.TB, test string, env ...string) *Child {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v")
	cmd.Env = append(append(os.Environ(), childEnv+"="+test), env...)
	c := &Child{Cmd: cmd, test: test, done: make(chan struct{})}
	c.lines.more = make(chan struct{})
	cmd.Stdout = io.MultiWriter(&c.output, &c.lines)
	cmd.Stderr = io.MultiWriter(&c.output, &c.stderr)
	// Bounds Wait should the child leave its stdout or stderr open to a
	// process of its own after it died.
	cmd.WaitDelay = 10 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	c.Stdin = stdin
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		c.err = cmd.Wait()
		c.lines.close()
		close(c.done)
	}()
	tb.Cleanup(func() {
		_ = c.Stop()
		if tb.Failed() {
			tb.Logf("child %s output:\n%s", test, c.Output())
		}
	})
	return c
}

// InChild reports whether this process is a child that StartChild started to
// run test.
func InChild(test string) bool { return os.Getenv(childEnv) == test }

// WaitFor reads the child's stdout, line by line from where the last WaitFor
// (or WaitForWithin) stopped, until match accepts one; it returns that line
// and true, or "" and false when the child's stdout ended first (it exited).
// One goroutine at a time may wait for lines.
func (c *Child) WaitFor(match func(line string) bool) (string, bool) {
	line, err := c.waitFor(nil, match)
	return line, err == nil
}

// WaitForWithin is WaitFor that gives up after timeout: its error says
// whether the child exited first (with how) or the time ran out.
func (c *Child) WaitForWithin(timeout time.Duration, match func(line string) bool) (string, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	line, err := c.waitFor(timer.C, match)
	if errors.Is(err, errTimeout) {
		return "", fmt.Errorf("child %s: no such line within %s", c.test, timeout)
	}
	return line, err
}

var errTimeout = errors.New("timeout")

func (c *Child) waitFor(timeout <-chan time.Time, match func(line string) bool) (string, error) {
	for {
		lines, more, closed := c.lines.since(c.read)
		for _, line := range lines {
			c.read++
			if match(line) {
				return line, nil
			}
		}
		if closed {
			<-c.done
			return "", fmt.Errorf("child %s exited (%v) first", c.test, c.err)
		}
		select {
		case <-more:
		case <-timeout:
			return "", errTimeout
		}
	}
}

// WaitForLine is WaitFor for a line equal to want.
func (c *Child) WaitForLine(want string) bool {
	_, ok := c.WaitFor(func(line string) bool { return line == want })
	return ok
}

// Kill SIGKILLs the child (no deferred code of it runs) and waits for it to
// end. It fails tb, with the child's output, unless the child died of that
// signal: a child that had already exited did not reach the point it was to
// be killed at.
func (c *Child) Kill(tb testing.TB) {
	tb.Helper()
	killErr := c.Cmd.Process.Kill()
	<-c.done
	if killErr != nil || !Killed(c.err) {
		tb.Fatalf("child %s: not killed (kill: %v), ended with %v; output:\n%s", c.test, killErr, c.err, c.Output())
	}
}

// Stop SIGKILLs the child if it is still running (resuming it first, should
// it be stopped) and waits for it to end; it returns how the child ended, as
// exec.Cmd.Wait does, and tolerates a child that had already exited.
func (c *Child) Stop() error {
	select {
	case <-c.done:
	default:
		_ = c.Cmd.Process.Signal(syscall.SIGCONT)
		_ = c.Cmd.Process.Kill()
		<-c.done
	}
	return c.err
}

// Done is closed when the child has exited (Wait then returns at once).
func (c *Child) Done() <-chan struct{} { return c.done }

// Wait waits for the child to exit on its own and returns its error, as
// exec.Cmd.Wait does.
func (c *Child) Wait() error {
	<-c.done
	return c.err
}

// WaitWithin is Wait that fails tb, with the child's output, if the child
// is still running after timeout.
func (c *Child) WaitWithin(tb testing.TB, timeout time.Duration) error {
	tb.Helper()
	select {
	case <-c.done:
		return c.err
	case <-time.After(timeout):
		tb.Fatalf("child %s still running after %s; output:\n%s", c.test, timeout, c.Output())
		return nil
	}
}

// Stderr returns what the child wrote on its stderr so far.
func (c *Child) Stderr() string { return c.stderr.String() }

// Output returns what the child wrote on its stdout and stderr so far, as it
// came: a child test's own failure message is on its stdout.
func (c *Child) Output() string { return c.output.String() }

// Killed reports whether err, from exec.Cmd.Wait or Child.Wait, is the exit
// of a process killed by a signal.
func Killed(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == -1
}

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

// lineBuffer keeps what is written to it as lines (without their "\n"),
// for a reader that waits for more.
type lineBuffer struct {
	mu      sync.Mutex
	lines   []string
	partial strings.Builder
	more    chan struct{} // closed, and replaced, at each new line
	closed  bool
}

func (l *lineBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	added := false
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			l.partial.Write(p)
			break
		}
		l.partial.Write(p[:i])
		l.lines = append(l.lines, strings.TrimSuffix(l.partial.String(), "\r"))
		l.partial.Reset()
		p = p[i+1:]
		added = true
	}
	if added {
		close(l.more)
		l.more = make(chan struct{})
	}
	return n, nil
}

// close ends the buffer: a last line without "\n" counts as a line.
func (l *lineBuffer) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.partial.Len() > 0 {
		l.lines = append(l.lines, strings.TrimSuffix(l.partial.String(), "\r"))
		l.partial.Reset()
	}
	l.closed = true
	close(l.more)
}

// since returns the lines from the i-th on, a channel closed when more come,
// and whether no more will.
func (l *lineBuffer) since(i int) ([]string, <-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines[i:], l.more, l.closed
}
