package testenv

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// childMode picks what TestChildProcess does: "" waits to be killed, "exit"
// fails at once, "stdin" echoes a line read from its stdin first.
const childMode = "IDEM_TESTENV_CHILD_MODE"

// TestChildProcess is the child the TestChild* tests start; it does nothing
// in a normal run.
func TestChildProcess(t *testing.T) {
	if !InChild("TestChildProcess") {
		return
	}
	fmt.Println("line 1")
	switch os.Getenv(childMode) {
	case "exit":
		t.Fatal("failing on purpose")
	case "stdin":
		fmt.Println("waiting")
		line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		fmt.Println("got " + strings.TrimSpace(line))
	}
	fmt.Println("ready")
	time.Sleep(time.Minute) // not synchronisation: the parent kills it here
	t.Fatal("not killed")
}

func TestStartChildKill(t *testing.T) {
	c := StartChild(t, "TestChildProcess")
	if !c.WaitForLine("ready") {
		t.Fatalf("no ready line; output:\n%s", c.Output())
	}
	c.Kill(t)
	if InChild("TestChildProcess") {
		t.Fatal("the parent is not the child")
	}
	if !Killed(c.Wait()) {
		t.Fatalf("Wait after Kill: %v, want killed by a signal", c.Wait())
	}
}

// A child that exits on its own: WaitFor and WaitForWithin say so, its
// failure message (on its stdout) is in Output, and Stop tolerates it.
func TestChildExitsFirst(t *testing.T) {
	c := StartChild(t, "TestChildProcess", childMode+"=exit")
	if _, ok := c.WaitFor(func(string) bool { return false }); ok {
		t.Fatal("WaitFor matched a line no matcher accepts")
	}
	if _, err := c.WaitForWithin(time.Minute, func(string) bool { return false }); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("WaitForWithin: %v, want the child's exit", err)
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Done not closed after the child's stdout ended")
	}
	err := c.Stop()
	if err == nil || Killed(err) {
		t.Fatalf("Stop: %v, want the child's own failing exit", err)
	}
	if err2 := c.WaitWithin(t, time.Second); err2 != err {
		t.Fatalf("WaitWithin: %v, want Stop's %v", err2, err)
	}
	if out := c.Output(); !strings.Contains(out, "failing on purpose") || !strings.Contains(out, "line 1") {
		t.Fatalf("Output lacks the child's stdout:\n%s", out)
	}
}

// WaitForWithin gives up on a child that is alive but silent; the lines it
// read are not read again.
func TestChildWaitForWithinTimeout(t *testing.T) {
	c := StartChild(t, "TestChildProcess")
	if !c.WaitForLine("ready") {
		t.Fatalf("no ready line; output:\n%s", c.Output())
	}
	if line, err := c.WaitForWithin(200*time.Millisecond, func(l string) bool { return l == "line 1" }); err == nil || !strings.Contains(err.Error(), "within") {
		t.Fatalf("WaitForWithin: %q %v, want a timeout (line 1 was read before)", line, err)
	}
	c.Kill(t)
}

// Stdin reaches the child; Stop kills a running child and says so.
func TestChildStdin(t *testing.T) {
	c := StartChild(t, "TestChildProcess", childMode+"=stdin")
	if !c.WaitForLine("waiting") {
		t.Fatalf("no waiting line; output:\n%s", c.Output())
	}
	if _, err := c.Stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForWithin(time.Minute, func(l string) bool { return l == "got go" }); err != nil {
		t.Fatalf("%v; output:\n%s", err, c.Output())
	}
	if err := c.Stop(); !Killed(err) {
		t.Fatalf("Stop: %v, want killed by a signal", err)
	}
	if err := c.Stop(); !Killed(err) {
		t.Fatalf("second Stop: %v, want the same", err)
	}
}
func TestMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total"}, []string{"group", "topic"})
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h"}, []string{"group"})
	reg.MustRegister(c, h)
	c.WithLabelValues("a", "t1").Add(2)
	c.WithLabelValues("a", "t2").Add(3)
	c.WithLabelValues("b", "t1").Add(5)
	h.WithLabelValues("a").Observe(1)
	h.WithLabelValues("a").Observe(2)
	for _, tc := range []struct {
		name  string
		want  map[string]string
		value float64
		found bool
	}{
		{"x_total", nil, 10, true},
		{"x_total", map[string]string{"group": "a"}, 5, true},
		{"x_total", map[string]string{"group": "a", "topic": "t2"}, 3, true},
		{"x_total", map[string]string{"group": "c"}, 0, false},
		{"h", map[string]string{"group": "a"}, 2, true},
		{"absent", nil, 0, false},
	} {
		v, ok := MetricFound(t, reg, tc.name, tc.want)
		if v != tc.value || ok != tc.found {
			t.Errorf("%s %v: %v %v, want %v %v", tc.name, tc.want, v, ok, tc.value, tc.found)
		}
	}
}
