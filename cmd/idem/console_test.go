package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testenv"
)

// TestConsoleRefusesUnsafeStarts: no authentication only on loopback, and
// never silently.
func TestConsoleRefusesUnsafeStarts(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		says string
	}{
		{[]string{"console", "--insecure-no-auth", "--listen", "0.0.0.0:8088"}, nil, "needs a loopback --listen"},
		{[]string{"console", "--insecure-no-auth", "--listen", ":8088"}, nil, "needs a loopback --listen"},
		{[]string{"console", "--insecure-no-auth", "--listen", "10.1.2.3:8088"}, nil, "needs a loopback --listen"},
		{[]string{"console", "--listen", "127.0.0.1:0"}, nil, "no tokens"},
		{[]string{"console", "--listen", "127.0.0.1:0"}, map[string]string{consoleTokensEnv: "admin:alice:short"}, "at least 16"},
		{[]string{"console", "--insecure-no-auth"}, map[string]string{consoleTokensEnv: "admin:alice:0123456789abcdef0"}, "contradict"},
		{[]string{"console", "--tokens-file", "/nonexistent/tokens"}, nil, "tokens file"},
	} {
		var out, errOut bytes.Buffer
		getenv := func(k string) string { return c.env[k] }
		if code := runEnv(c.args, getenv, strings.NewReader(""), &out, &errOut); code != 1 || !strings.Contains(errOut.String(), c.says) {
			t.Errorf("idem %s: exit %d, %q; want 1 and an error saying %q", strings.Join(c.args, " "), code, errOut.String(), c.says)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:80": true, "[::1]:8088": true, "localhost:1": true, ":8088": false, "0.0.0.0:1": false, "example.com:80": false, "127.0.0.1": false} {
		if isLoopback(addr) != want {
			t.Errorf("isLoopback(%q) = %v", addr, !want)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

// TestConsoleServes starts idem console with a token from the environment
// and calls its API: the address it prints answers, tokens are checked,
// --metrics-addr serves the index's gauges (registered once, through the
// console's and the indexer's Registerer), and it stops cleanly when its
// context ends.
func TestConsoleServes(t *testing.T) {
	k := idemtest.Connect(t)
	// An empty schema (internal/testenv; idemtest.ConnectPostgres would
	// create idem's tables): idem console creates the index's tables itself.
	url := testenv.DatabaseURL(t)
	_, schema := testenv.PostgresSchema(t)
	dlqTopic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
	seed(t, k, dlqTopic, origin, 2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	secret := "0123456789abcdef0123"
	var out, errOut syncBuffer
	a := &app{getenv: func(name string) string {
		switch name {
		case consoleTokensEnv:
			return "operator:olga:" + secret
		case "KAFKA_BROKERS":
			return strings.Join(k.Brokers, ",")
		}
		return os.Getenv(name)
	}, out: &out, errOut: &errOut}
	a.args = []string{"console", "--listen", "127.0.0.1:0", "--database-url", url + "&search_path=" + schema,
		"--topics", dlqTopic, "--indexer-group", k.Group(t, "indexer"), "--mask", "card.number", "--metrics-addr", metricsAddr, "--topic-refresh", "1s"}
	root := newRootCmd(a)
	root.SetArgs(a.args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("idem console did not stop within 30s of its context ending")
		}
	})

	addrRE := regexp.MustCompile(`idem console: (http://127\.0\.0\.1:\d+/)`)
	var base string
	idemtest.Eventually(t, 30*time.Second, func() error {
		select {
		case err := <-done:
			t.Fatalf("idem console ended: %v\n%s", err, errOut.String())
		default:
		}
		m := addrRE.FindStringSubmatch(out.String())
		if m == nil {
			return io.ErrUnexpectedEOF
		}
		base = m[1]
		return nil
	})
	call := func(path, token string) (int, string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := call("api/whoami", secret); code != 200 || !strings.Contains(b, `"olga"`) || !strings.Contains(b, `"operator"`) {
		t.Errorf("whoami: %d %s", code, b)
	}
	if code, _ := call("api/overview", ""); code != 401 {
		t.Errorf("overview without a token: %d, want 401", code)
	}
	if code, b := call("api/overview", secret); code != 200 || !strings.Contains(b, `"topics"`) {
		t.Errorf("overview: %d %s", code, b)
	}
	if code, _ := call("login", ""); code != 200 {
		t.Errorf("login page: %d", code)
	}
	unresolved := `idem_dlq_unresolved{group="billing",topic="` + dlqTopic + `"} 2`
	retention := `idem_dlq_retention_seconds{topic="` + dlqTopic + `"}`
	idemtest.Eventually(t, 60*time.Second, func() error {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), unresolved) || !strings.Contains(string(b), retention) {
			return fmt.Errorf("/metrics lacks %s or %s", unresolved, retention)
		}
		return nil
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("idem console: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("idem console did not stop")
	}
	done <- nil // for the cleanup
}
