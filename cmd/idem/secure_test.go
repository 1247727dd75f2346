package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	idemroot "github.com/idemhq/idem"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/kafkaauth"
	"github.com/idemhq/idem/retrytopic"
)

// idemEnv runs the CLI in process with exactly the environment env (nothing
// of the test process's) and returns its exit code, stdout and stderr.
func idemEnv(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runEnv(args, func(k string) string { return env[k] }, strings.NewReader(""), &out, &errOut)
	t.Logf("idem %s -> %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// TestSecureCluster runs a consumer (consumer.Run with a PostgreSQL inbox)
// and `idem dlq list`/`depth` through the SASL_SSL listener of a broker of the
// test's own: TLS with a broker certificate made by keytool, client
// certificates required, SCRAM credentials created at storage format.
func TestSecureCluster(t *testing.T) {
	t.Parallel()
	k := testenv.NewSecureKafka(t)
	source := k.Topic(t, 2)
	group := testenv.Group(t)
	dlqTopic := retrytopic.Policy{}.DLQ(source, group)
	t.Cleanup(func() { k.DeleteTopics(t, dlqTopic) })

	// Three records to handle, two the handler rejects for good.
	p := k.Producer(t)
	for i := range 5 {
		v := fmt.Sprint("ok-", i)
		if i >= 3 {
			v = fmt.Sprint("bad-", i)
		}
		_, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: source, Partition: int32(i % 2), Value: sarama.StringEncoder(v),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(fmt.Sprint("key-", i))}}})
		if err != nil {
			t.Fatal(err)
		}
	}

	ctx := testenv.Context(t)
	pool := testenv.Postgres(t)
	if err := idemroot.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	cfg := sarama.NewConfig()
	cfg.Version = testenv.KafkaVersion
	if err := kafkaauth.Apply(cfg, k.Auth("SCRAM-SHA-256")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled := map[string]bool{}
	h := handler.Func(func(_ context.Context, m *handler.Message) error {
		if strings.HasPrefix(string(m.Value), "bad-") {
			return handler.Permanent(errors.New("rejected: " + string(m.Value)))
		}
		mu.Lock()
		defer mu.Unlock()
		handled[string(m.Value)] = true
		return nil
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- consumer.Run(runCtx, consumer.Config{
			Brokers: k.Brokers, Group: group, Topics: []string{source}, Sarama: cfg,
			Dedupe: dedupe.NewPostgres(pool), Logger: slog.New(slog.DiscardHandler),
		}, h)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("consumer.Run: %v", err)
		}
	})

	// The CLI through SASL_SSL: flags, password from IDEM_SASL_PASSWORD.
	secure := func(mechanism string) []string {
		return []string{"-b", strings.Join(k.Brokers, ","), "--tls-ca", k.CAFile, "--tls-cert", k.CertFile, "--tls-key", k.KeyFile,
			"--sasl-mechanism", mechanism, "--sasl-user", k.User}
	}
	withPassword := map[string]string{"IDEM_SASL_PASSWORD": k.Password}
	testenv.Eventually(t, 2*time.Minute, func() error {
		select {
		case err := <-done:
			t.Fatalf("consumer.Run ended: %v", err)
		default:
		}
		code, out, errOut := idemEnv(t, withPassword, append([]string{"dlq", "depth", "--source", source, "--group", group, "--json"}, secure("SCRAM-SHA-512")...)...)
		var depth struct {
			Total int64 `json:"total"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &depth) != nil {
			return fmt.Errorf("depth: code %d %s", code, errOut)
		}
		mu.Lock()
		n := len(handled)
		mu.Unlock()
		if depth.Total != 2 || n != 3 {
			return fmt.Errorf("dead-lettered %d of 2, handled %d of 3", depth.Total, n)
		}
		return nil
	})
	var inbox int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idem_processed WHERE consumer_group = $1", group).Scan(&inbox); err != nil || inbox != 3 {
		t.Fatalf("inbox rows of %s: %d (%v), want 3", group, inbox, err)
	}

	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run("dlq list "+mech, func(t *testing.T) {
			code, out, _ := idemEnv(t, withPassword, append([]string{"dlq", "list", "-t", dlqTopic}, secure(mech)...)...)
			if code != 0 || !strings.Contains(out, "permanent") || !strings.Contains(out, "depth: 2 pending in "+dlqTopic) {
				t.Fatalf("code %d\n%s", code, out)
			}
		})
	}
	t.Run("dlq list from environment variables", func(t *testing.T) {
		env := map[string]string{"KAFKA_BROKERS": strings.Join(k.Brokers, ","), "IDEM_TLS": "true", "IDEM_TLS_CA": k.CAFile,
			"IDEM_TLS_CERT": k.CertFile, "IDEM_TLS_KEY": k.KeyFile, "IDEM_SASL_MECHANISM": "scram-sha-512",
			"IDEM_SASL_USER": k.User, "IDEM_SASL_PASSWORD": k.Password}
		code, out, _ := idemEnv(t, env, "dlq", "list", "--source", source, "--group", group, "--json")
		var listed struct {
			Depth int64 `json:"depth"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || listed.Depth != 2 {
			t.Fatalf("code %d\n%s", code, out)
		}
	})
	t.Run("insecure skip verify warns", func(t *testing.T) {
		args := []string{"dlq", "depth", "-t", dlqTopic, "-b", strings.Join(k.Brokers, ","), "--tls-insecure-skip-verify",
			"--tls-cert", k.CertFile, "--tls-key", k.KeyFile, "--sasl-mechanism", "PLAIN", "--sasl-user", k.User}
		code, out, errOut := idemEnv(t, withPassword, args...)
		if code != 0 || !strings.Contains(out, "total: 2 pending") || !strings.Contains(errOut, "warning: --tls-insecure-skip-verify") {
			t.Fatalf("code %d\n%s%s", code, out, errOut)
		}
	})
	refused := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"wrong password", map[string]string{"IDEM_SASL_PASSWORD": "wrong"}, secure("SCRAM-SHA-512"), "invalid credentials"},
		{"no client certificate", withPassword, []string{"-b", strings.Join(k.Brokers, ","), "--tls-ca", k.CAFile,
			"--sasl-mechanism", "SCRAM-SHA-512", "--sasl-user", k.User}, "bad certificate"},
		{"broker certificate not trusted", withPassword, []string{"-b", strings.Join(k.Brokers, ","), "--tls", "--tls-cert", k.CertFile,
			"--tls-key", k.KeyFile, "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-user", k.User}, "x509"},
		{"no password", nil, secure("SCRAM-SHA-512"), "IDEM_SASL_PASSWORD"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := idemEnv(t, tt.env, append([]string{"dlq", "depth", "-t", dlqTopic}, tt.args...)...)
			if code != 1 || out != "" || !strings.HasPrefix(errOut, "idem: ") || !strings.Contains(errOut, tt.want) {
				t.Fatalf("code %d, stdout %q, stderr %q: want a refusal mentioning %q", code, out, errOut, tt.want)
			}
		})
	}
}
