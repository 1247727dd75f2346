package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
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
		// Tokens and cookies never cross a network in clear.
		{[]string{"console", "--listen", ":8088"}, map[string]string{consoleTokensEnv: "admin:alice:0123456789abcdef0"}, "in clear"},
		{[]string{"console", "--listen", "10.1.2.3:8088"}, map[string]string{consoleTokensEnv: "admin:alice:0123456789abcdef0"}, "--http-tls-cert"},
		{[]string{"console", "--listen", ":8443", "--http-tls-cert", "c.pem"}, map[string]string{consoleTokensEnv: "admin:alice:0123456789abcdef0"}, "go together"},
		{[]string{"console", "--listen", ":8443", "--http-tls-cert", "c.pem", "--http-tls-key", "k.pem", "--behind-proxy"},
			map[string]string{consoleTokensEnv: "admin:alice:0123456789abcdef0"}, "contradict"},
		{[]string{"console", "--max-operator-records", "0"}, map[string]string{consoleTokensEnv: "admin:alice:0123456789abcdef0"}, "max-operator-records"},
		// A tokens entry in error never repeats its secret.
		{[]string{"console"}, map[string]string{consoleTokensEnv: "s3cr3t-0123456789abcdef:admin:alice"}, "is not viewer, operator or admin"},
	} {
		var out, errOut bytes.Buffer
		getenv := func(k string) string { return c.env[k] }
		if code := runEnv(c.args, getenv, strings.NewReader(""), &out, &errOut); code != 1 || !strings.Contains(errOut.String(), c.says) {
			t.Errorf("idem %s: exit %d, %q; want 1 and an error saying %q", strings.Join(c.args, " "), code, errOut.String(), c.says)
		}
		if strings.Contains(errOut.String(), "s3cr3t") {
			t.Errorf("idem %s: the error repeats the secret: %s", strings.Join(c.args, " "), errOut.String())
		}
	}
	// A tokens file its group or others may read is refused, or accepted
	// with a warning when asked.
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte("admin alice 0123456789abcdef0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := &app{getenv: func(string) string { return "" }, errOut: io.Discard}
	if _, err := a.consoleTokens(consoleOptions{tokensFile: file}); err == nil || !strings.Contains(err.Error(), "0644") {
		t.Errorf("a tokens file of mode 0644: %v, want refused", err)
	}
	var warn bytes.Buffer
	a.errOut = &warn
	if ts, err := a.consoleTokens(consoleOptions{tokensFile: file, anyTokensMode: true}); err != nil || len(ts) != 1 || !strings.Contains(warn.String(), "warning") {
		t.Errorf("--tokens-file-any-mode: %v, %v, %q", ts, err, warn.String())
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
	// An empty schema (internal/testing/testenv; idemtest.ConnectPostgres would
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
	base, stop := startConsole(t, map[string]string{consoleTokensEnv: "operator:olga:" + secret, "KAFKA_BROKERS": strings.Join(k.Brokers, ",")},
		"console", "--listen", "127.0.0.1:0", "--database-url", url+"&search_path="+schema,
		"--topics", dlqTopic, "--indexer-group", k.Group(t, "indexer"), "--mask", "card.number", "--metrics-addr", metricsAddr, "--topic-refresh", "1s")
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
	if err := stop(); err != nil {
		t.Errorf("idem console: %v", err)
	}
}

// startConsole runs idem with args and env (else the process's) until the
// test ends or stop is called, and returns the address it prints.
func startConsole(t *testing.T, env map[string]string, args ...string) (base string, stop func() error) {
	t.Helper()
	var out, errOut syncBuffer
	a := &app{getenv: func(name string) string {
		if v, ok := env[name]; ok {
			return v
		}
		return os.Getenv(name)
	}, out: &out, errOut: &errOut, args: args}
	root := newRootCmd(a)
	root.SetArgs(a.args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	var result error
	stopped := false
	stop = func() error {
		if stopped {
			return result
		}
		stopped = true
		cancel()
		select {
		case result = <-done:
		case <-time.After(30 * time.Second):
			result = errors.New("idem console did not stop within 30s of its context ending")
		}
		return result
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	addrRE := regexp.MustCompile(`idem console: (https?://127\.0\.0\.1:\d+/)`)
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
	return base, stop
}

// TestConsoleServesTLS: with --http-tls-cert and --http-tls-key the console
// serves HTTPS on any address, and its cookies are Secure and __Host-.
func TestConsoleServesTLS(t *testing.T) {
	k := idemtest.Connect(t)
	url := testenv.DatabaseURL(t)
	_, schema := testenv.PostgresSchema(t)
	certFile, keyFile, pool := selfSigned(t)
	base, _ := startConsole(t, map[string]string{consoleTokensEnv: "viewer:vic:0123456789abcdef0123", "KAFKA_BROKERS": strings.Join(k.Brokers, ",")},
		"console", "--listen", "127.0.0.1:0", "--database-url", url+"&search_path="+schema, "--topics", k.Topic(t, "dlq", 1),
		"--indexer-group", k.Group(t, "indexer"), "--http-tls-cert", certFile, "--http-tls-key", keyFile)
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("idem console serves %s, want https", base)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := c.Get(base + "login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cs := resp.Cookies()
	if resp.StatusCode != 200 || len(cs) == 0 {
		t.Fatalf("login page over TLS: %d, cookies %v", resp.StatusCode, cs)
	}
	for _, ck := range cs {
		if !ck.Secure || !strings.HasPrefix(ck.Name, "__Host-") {
			t.Errorf("cookie %s: Secure %v", ck.Name, ck.Secure)
		}
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key to files and
// returns them with a pool that trusts the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idem console test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestConsolePoolBoundsStatements: every connection of idem console's pool
// runs under the statement_timeout it was given.
func TestConsolePoolBoundsStatements(t *testing.T) {
	pool, err := consolePool(t.Context(), testenv.DatabaseURL(t), 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var got string
	if err := pool.QueryRow(t.Context(), `SHOW statement_timeout`).Scan(&got); err != nil || got != "1500ms" {
		t.Errorf("statement_timeout = %q, %v; want 1500ms", got, err)
	}
	if _, err := pool.Exec(t.Context(), `SELECT pg_sleep(5)`); err == nil || !strings.Contains(err.Error(), "statement timeout") {
		t.Errorf("a 5 s statement: %v, want cancelled by the statement timeout", err)
	}
}

// The console's server bounds every phase of a connection (issue 29, item
// 7): reading headers and body, writing the response, and idling between
// requests; and a client that opens a connection and says nothing is cut
// off once the header timeout passes.
func TestConsoleServerBoundsConnections(t *testing.T) {
	t.Parallel()
	srv := consoleServer(http.NotFoundHandler(), slog.New(slog.DiscardHandler))
	for name, d := range map[string]time.Duration{"ReadHeaderTimeout": srv.ReadHeaderTimeout, "ReadTimeout": srv.ReadTimeout,
		"WriteTimeout": srv.WriteTimeout, "IdleTimeout": srv.IdleTimeout} {
		if d <= 0 {
			t.Errorf("%s = %v: unbounded", name, d)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(srv.ReadHeaderTimeout + 30*time.Second))
	if _, err := io.ReadAll(conn); err != nil { // EOF: the server closed the silent connection
		t.Fatalf("a silent connection was not closed by the server: %v", err)
	}
}
