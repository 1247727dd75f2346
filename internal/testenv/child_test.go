package testenv

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestChildProcess is the child TestStartChildKill starts; it does nothing in
// a normal run.
func TestChildProcess(t *testing.T) {
	if !InChild("TestChildProcess") {
		return
	}
	fmt.Println("line 1")
	fmt.Println("ready")
	time.Sleep(time.Minute) // not synchronisation: the parent kills it here
	t.Fatal("not killed")
}

func TestStartChildKill(t *testing.T) {
	c := StartChild(t, "TestChildProcess")
	if !c.WaitForLine("ready") {
		t.Fatalf("no ready line; stderr:\n%s", c.Stderr())
	}
	c.Kill(t)
	if InChild("TestChildProcess") {
		t.Fatal("the parent is not the child")
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
