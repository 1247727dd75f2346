package payments

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// The files the operations side ships; the test reads its queries from them,
// so a panel or rule that names a metric idem does not export fails here.
const (
	dashboardFile = "../../../deploy/grafana/dashboards/idem.json"
	alertsFile    = "../../../deploy/prometheus/alerts.yml"
)

// mayBeAbsent are the series a healthy demo run need not produce: counters of
// failures that did not happen, and the failure index's gauges (the demo runs
// no indexer). Each must still be a metric package metrics or the failure
// index (internal/failidx) defines (checked by name in their source).
var mayBeAbsent = map[string]string{
	"idem_outbox_publish_failures_total": "no outbox publish failed",
	"idem_dlq_unresolved":                "the demo runs no failure indexer",
	"idem_dlq_oldest_unresolved_seconds": "the demo runs no failure indexer",
	"idem_dlq_retention_seconds":         "the demo runs no failure indexer",
}

// query is one PromQL expression from the dashboard or the rules.
type query struct {
	From string // "dashboard: <panel>" or "rule: <alert>"
	Expr string
}

// dashboardQueries returns every expr of the dashboard's panels (rows
// included) and the queries of its template variables.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query struct {
					Query string `json:"query"`
				} `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var qs []query
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				qs = append(qs, query{"dashboard: " + p.Title, tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if inner, ok := strings.CutPrefix(v.Query.Query, "label_values("); ok {
			if sel, _, ok := strings.Cut(inner, ","); ok {
				qs = append(qs, query{"dashboard variable: " + v.Name, sel})
			}
		}
	}
	return qs
}

type dashPanel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

// ruleQueries returns the expr of every rule of alerts.yml, checking each
// alert has a runbook annotation.
func ruleQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
				Annotations         map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	var qs []query
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && strings.TrimSpace(r.Annotations["runbook"]) == "" {
				t.Errorf("alert %s has no runbook annotation", r.Alert)
			}
			qs = append(qs, query{"rule: " + r.Alert + r.Record, r.Expr})
		}
	}
	return qs
}

// matcher is one label matcher of a selector.
type matcher struct{ Label, Op, Value string }

// selector is one vector selector of a query: a metric name and matchers.
type selector struct {
	Name     string
	Matchers []matcher
}

func (s selector) String() string {
	var ms []string
	for _, m := range s.Matchers {
		ms = append(ms, m.Label+m.Op+strconv.Quote(m.Value))
	}
	return s.Name + "{" + strings.Join(ms, ",") + "}"
}

var (
	selectorRE = regexp.MustCompile(`(?:^|[^a-zA-Z0-9_:])(idem_[a-zA-Z0-9_:]*)\s*(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")`)
)

// selectors parses the vector selectors of idem's metrics out of expr.
func selectors(expr string) ([]selector, error) {
	var out []selector
	for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
		s := selector{Name: m[1]}
		if m[2] != "" {
			for _, mm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
				v, err := strconv.Unquote(mm[3])
				if err != nil {
					return nil, fmt.Errorf("%s: %w", mm[0], err)
				}
				s.Matchers = append(s.Matchers, matcher{mm[1], mm[2], v})
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// sample is one line of the text exposition format.
type sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// parseExposition parses Prometheus's text format (what /metrics serves).
func parseExposition(r io.Reader) ([]sample, error) {
	var out []sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{Labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i > 0 {
			s.Name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				return nil, fmt.Errorf("bad line %q", line)
			}
			for _, mm := range matcherRE.FindAllStringSubmatch(rest[1:end], -1) {
				v, err := strconv.Unquote(mm[3])
				if err != nil {
					return nil, fmt.Errorf("bad label in %q: %w", line, err)
				}
				s.Labels[mm[1]] = v
			}
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("no value in %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("bad value in %q: %w", line, err)
		}
		s.Value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// matches reports whether s is selected by sel. Matchers on a dashboard
// variable ($group) select everything.
func (sel selector) matches(s sample) bool {
	if s.Name != sel.Name {
		return false
	}
	for _, m := range sel.Matchers {
		if strings.Contains(m.Value, "$") {
			continue
		}
		v := s.Labels[m.Label]
		switch m.Op {
		case "=":
			if v != m.Value {
				return false
			}
		case "!=":
			if v == m.Value {
				return false
			}
		case "=~", "!~":
			ok := regexp.MustCompile("^(?:" + m.Value + ")$").MatchString(v)
			if ok != (m.Op == "=~") {
				return false
			}
		}
	}
	return true
}

// implausible returns what is wrong with the samples of one metric family:
// every idem metric is a count, a duration, a depth or a state, never
// negative nor NaN; breaker states are 0, 1 or 2; histogram buckets are
// cumulative and end at _count.
func implausible(samples []sample) []string {
	var bad []string
	buckets := map[string][]sample{}
	counts := map[string]float64{}
	key := func(s sample) string {
		var ks []string
		for k, v := range s.Labels {
			if k != "le" {
				ks = append(ks, k+"="+v)
			}
		}
		sort.Strings(ks)
		return strings.TrimSuffix(strings.TrimSuffix(s.Name, "_bucket"), "_count") + "{" + strings.Join(ks, ",") + "}"
	}
	for _, s := range samples {
		if !strings.HasPrefix(s.Name, "idem_") {
			continue
		}
		if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) || s.Value < 0 {
			bad = append(bad, fmt.Sprintf("%s%v = %v", s.Name, s.Labels, s.Value))
		}
		if s.Name == "idem_breaker_state" && s.Value != 0 && s.Value != 1 && s.Value != 2 {
			bad = append(bad, fmt.Sprintf("%s%v = %v, want 0, 1 or 2", s.Name, s.Labels, s.Value))
		}
		switch {
		case strings.HasSuffix(s.Name, "_bucket"):
			buckets[key(s)] = append(buckets[key(s)], s)
		case strings.HasSuffix(s.Name, "_count"):
			counts[key(s)] = s.Value
		}
	}
	for k, bs := range buckets {
		le := func(s sample) float64 { v, _ := strconv.ParseFloat(s.Labels["le"], 64); return v }
		slices.SortFunc(bs, func(a, b sample) int { return cmpFloat(le(a), le(b)) })
		for i := 1; i < len(bs); i++ {
			if bs[i].Value < bs[i-1].Value {
				bad = append(bad, fmt.Sprintf("%s: bucket le=%s (%v) < le=%s (%v)", k, bs[i].Labels["le"], bs[i].Value, bs[i-1].Labels["le"], bs[i-1].Value))
			}
		}
		if last := bs[len(bs)-1]; last.Labels["le"] != "+Inf" || last.Value != counts[k] {
			bad = append(bad, fmt.Sprintf("%s: +Inf bucket %v != _count %v", k, last.Value, counts[k]))
		}
	}
	return bad
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// scrape fetches and parses url.
func scrape(ctx context.Context, url string) ([]sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseExposition(resp.Body)
}

// checkScrape returns what is missing or implausible in samples for qs,
// and what the demo run guarantees.
func checkScrape(samples []sample, qs []query, metricsSource string) []string {
	var problems []string
	seen := map[string]bool{}
	for _, q := range qs {
		sels, err := selectors(q.Expr)
		if err != nil || len(sels) == 0 {
			problems = append(problems, fmt.Sprintf("%s: no idem selector in %q (%v)", q.From, q.Expr, err))
			continue
		}
		for _, sel := range sels {
			if seen[sel.String()] {
				continue
			}
			seen[sel.String()] = true
			var n int
			for _, s := range samples {
				if sel.matches(s) {
					n++
				}
			}
			if n > 0 {
				continue
			}
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(sel.Name, "_bucket"), "_count"), "_sum")
			if _, ok := mayBeAbsent[base]; ok && strings.Contains(metricsSource, `"`+base+`"`) {
				continue
			}
			problems = append(problems, fmt.Sprintf("%s: no series for %s", q.From, sel))
		}
	}
	problems = append(problems, implausible(samples)...)
	// What this run guarantees: every outcome, a retry tier, the DLQ, a
	// breaker that opened and closed, latencies observed.
	for _, want := range []struct {
		sel selector
		min float64
	}{
		{selector{"idem_messages_total", []matcher{{"outcome", "=", "processed"}}}, 1},
		{selector{"idem_messages_total", []matcher{{"outcome", "=", "duplicate"}}}, 1},
		{selector{"idem_messages_total", []matcher{{"outcome", "=", "dead_lettered"}}}, 1},
		{selector{"idem_messages_total", []matcher{{"outcome", "=", "retried"}}}, 1},
		{selector{"idem_dlq_depth", nil}, 1},
		{selector{"idem_breaker_transitions_total", []matcher{{"to", "=", "open"}}}, 1},
		{selector{"idem_end_to_end_seconds_count", nil}, 1},
	} {
		var sum float64
		for _, s := range samples {
			if want.sel.matches(s) {
				sum += s.Value
			}
		}
		if sum < want.min {
			problems = append(problems, fmt.Sprintf("run: sum of %s = %v, want >= %v", want.sel, sum, want.min))
		}
	}
	return problems
}

// metricsSource is the text of the files where idem's metrics are named:
// package metrics (the documented table), the consumer's collectors
// (internal/coremetrics), the failure index, and the metrics.go of each
// component that keeps its own collectors (outbox, saga, checkpoint, ...).
func metricsSource(t *testing.T) string {
	t.Helper()
	var files []string
	for _, pattern := range []string{"../../../metrics/*.go", "../../../internal/coremetrics/*.go", "../../../internal/failidx/*.go", "../../../*/metrics.go"} {
		fs, err := filepath.Glob(pattern)
		if err != nil || len(fs) == 0 {
			t.Fatalf("metrics sources %s: %v (none found)", pattern, err)
		}
		files = append(files, fs...)
	}
	var b strings.Builder
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(src)
	}
	return b.String()
}

func TestSelectors(t *testing.T) {
	got, err := selectors(`sum(rate(idem_forwarded_total{group=~"$group",destination=~".+\\.retry\\.[0-9]+"}[5m])) / on() idem_dlq_depth > 0 and not my_idem_x`)
	if err != nil {
		t.Fatal(err)
	}
	want := []selector{
		{"idem_forwarded_total", []matcher{{"group", "=~", "$group"}, {"destination", "=~", `.+\.retry\.[0-9]+`}}},
		{"idem_dlq_depth", nil},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("selectors = %v, want %v", got, want)
	}
	s := sample{Name: "idem_forwarded_total", Labels: map[string]string{"group": "g", "destination": "p.g.retry.2"}}
	if !got[0].matches(s) {
		t.Errorf("%v does not match %v", got[0], s)
	}
	s.Labels["destination"] = "p.g.dlq"
	if got[0].matches(s) {
		t.Errorf("%v matches %v", got[0], s)
	}
}

// TestObservability runs the demo (every fault on) with its metrics served,
// and a real Prometheus (the Debian package's binary) scraping it every
// second with deploy/prometheus/alerts.yml loaded. Once every record is
// committed it checks that every series the dashboard and the alert rules
// select is on /metrics with plausible values, that Prometheus evaluated every
// rule without error, and that every rule and panel query succeeds through
// Prometheus's HTTP API.
func TestObservability(t *testing.T) {
	servicesEnv(t) // skips under -short before looking for prometheus
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("the prometheus server is needed (Debian package prometheus: apt-get install prometheus; .ci/run installs it): %v", err)
	}
	qs := append(dashboardQueries(t), ruleQueries(t)...)
	if len(qs) < 20 {
		t.Fatalf("only %d queries found in %s and %s", len(qs), dashboardFile, alertsFile)
	}
	src := metricsSource(t)

	o := testDemoOptions(t)
	// Enough bank failures that some payments fail their in-process retry
	// too and reach a retry tier (P(none of 300) < 1e-8).
	o.Bank.faults.FailureRate = 0.25
	target := o.Metrics.Addr().String()
	prom := startPrometheus(t, promBin, target)

	o.consumed = func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		// 1. /metrics: every selected series, plausible values.
		var problems []string
		err := poll(ctx, 250*time.Millisecond, func() (bool, error) {
			samples, err := scrape(ctx, "http://"+target+"/metrics")
			if err != nil {
				return false, err
			}
			problems = checkScrape(samples, qs, src)
			return len(problems) == 0, nil
		})
		if err != nil {
			return fmt.Errorf("/metrics: %w:\n  %s", err, strings.Join(problems, "\n  "))
		}
		// 2. Prometheus has scraped it and evaluated every rule without error.
		var last string
		err = poll(ctx, 500*time.Millisecond, func() (bool, error) {
			var rules struct {
				Groups []struct {
					Rules []struct {
						Name, Health, LastError string
						Query                   string `json:"query"`
					}
				}
			}
			if err := prom.get(ctx, "/api/v1/rules", nil, &rules); err != nil {
				return false, err
			}
			var n int
			for _, g := range rules.Groups {
				for _, r := range g.Rules {
					n++
					switch r.Health {
					case "ok":
					case "err":
						return false, fmt.Errorf("rule %s: %s", r.Name, r.LastError)
					default:
						last = fmt.Sprintf("rule %s not evaluated yet (%s)", r.Name, r.Health)
						return false, nil
					}
				}
			}
			return n == len(ruleQueries(t)), nil
		})
		if err != nil {
			return fmt.Errorf("prometheus rules: %w (%s)", err, last)
		}
		// 3. Every query through the HTTP API: no error; panel queries over
		// metrics this run produces return data once two scrapes hold them.
		for _, q := range qs {
			expr := strings.NewReplacer("$__rate_interval", "1m", "$group", ".*").Replace(q.Expr)
			needData := strings.HasPrefix(q.From, "dashboard") && !mentionsAbsent(expr)
			err := poll(ctx, 500*time.Millisecond, func() (bool, error) {
				var res struct {
					ResultType string            `json:"resultType"`
					Result     []json.RawMessage `json:"result"`
				}
				if err := prom.get(ctx, "/api/v1/query", url.Values{"query": {expr}}, &res); err != nil {
					return false, err
				}
				return !needData || len(res.Result) > 0, nil
			})
			if err != nil {
				return fmt.Errorf("%s: query %s: %w", q.From, expr, err)
			}
		}
		return nil
	}
	runCheckedDemo(t, o)
}

// mentionsAbsent reports whether expr selects a metric of mayBeAbsent.
func mentionsAbsent(expr string) bool {
	for name := range mayBeAbsent {
		if strings.Contains(expr, name) {
			return true
		}
	}
	return false
}

// poll calls f every interval until it returns true or an error, or ctx ends.
func poll(ctx context.Context, every time.Duration, f func() (bool, error)) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		ok, err := f()
		if ok && err == nil {
			return nil
		}
		var qerr *promError
		if errors.As(err, &qerr) {
			return err // Prometheus rejected the query: no point asking again
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("%w (last: %v)", context.Cause(ctx), err)
			}
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

// promServer is a Prometheus started by the test.
type promServer struct{ base string }

// promError is an error answer of Prometheus's API.
type promError struct{ Type, Msg string }

func (e *promError) Error() string { return "prometheus: " + e.Type + ": " + e.Msg }

// get calls the API at path and decodes its data into v.
func (p promServer) get(ctx context.Context, path string, q url.Values, v any) error {
	u := p.base + path
	if q != nil {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var env struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return fmt.Errorf("GET %s: %s: %w", path, resp.Status, err)
	}
	if env.Status != "success" {
		return &promError{env.ErrorType, env.Error}
	}
	return json.Unmarshal(env.Data, v)
}

// startPrometheus runs prometheus in a temporary directory, scraping target
// every second and evaluating alerts.yml every second, until the test ends.
func startPrometheus(t *testing.T, bin, target string) promServer {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: payments-demo
    static_configs:
      - targets: [%q]
`, rules, target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// A free port for its web listener: taken, then released for it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	logs := new(lockedBuffer)
	cmd := exec.Command(bin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	p := promServer{base: "http://" + addr}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = poll(ctx, 100*time.Millisecond, func() (bool, error) {
		select {
		case err := <-exited:
			exited <- err
			return false, &promError{"exited", fmt.Sprint(err)}
		default:
		}
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("prometheus at %s not ready: %v\n%s", addr, err, logs.String())
	}
	return p
}

// lockedBuffer is a bytes.Buffer safe for the writes of a child process's
// output copier and the test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
