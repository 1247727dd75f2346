package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/console/index"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// Tokens of the test console.
const (
	adminSecret    = "admin-secret-0123456789"
	operatorSecret = "operator-secret-0123456789"
	viewerSecret   = "viewer-secret-0123456789"
)

// env is a console on a PostgreSQL schema of its own with idem's tables
// (idemtest.ConnectPostgres) and the test's Kafka (idemtest.Connect),
// served by an httptest server, with the index's indexer running.
type env struct {
	k      *idemtest.Kafka
	pool   *pgxpool.Pool
	store  *failidx.Store // reads what the console shows
	client sarama.Client
	srv    *httptest.Server
	reg    prometheus.Registerer // Config.Registerer, given to runIndexer's indexer too
	kek    string                // Config.EncryptionKey, given to runIndexer's indexer too
	cfg    Config                // the console's config (restart builds the next one from it)
	// console is the handler srv serves, closed when the test ends.
	console *Console
}

// newEnv starts a console whose Config is the test default changed by mut.
func newEnv(t *testing.T, mut func(*Config)) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped with -short")
	}
	e := &env{k: idemtest.Connect(t), pool: idemtest.ConnectPostgres(t).Pool}
	cl, err := sarama.NewClient(e.k.Brokers, failidx.ProducerConfig(e.k.SaramaConfig()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	e.client, e.store = cl, failidx.NewStore(e.pool)
	cfg := Config{
		Pool: e.pool, Client: cl,
		Tokens: []Token{
			{Name: "alice", Role: Admin, Secret: adminSecret},
			{Name: "olga", Role: Operator, Secret: operatorSecret},
			{Name: "vic", Role: Viewer, Secret: viewerSecret},
		},
	}
	if mut != nil {
		mut(&cfg)
	}
	e.cfg = cfg
	e.serve(t)
	return e
}

// serve starts a console on e.cfg and serves it.
func (e *env) serve(t *testing.T) {
	t.Helper()
	c, err := New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.console, e.reg, e.kek = c, e.cfg.Registerer, e.cfg.EncryptionKey
	e.srv = httptest.NewServer(c)
	t.Cleanup(func() {
		e.srv.Close()
		_ = c.Close()
	})
}

// restart stops e's console (its jobs handed back) and returns an env with
// a new console on the same database, Kafka client and config, as a
// restarted process would run.
func (e *env) restart(t *testing.T) *env {
	t.Helper()
	e.srv.Close()
	if err := e.console.Close(); err != nil {
		t.Fatal(err)
	}
	next := *e
	next.cfg.Registerer = nil
	next.serve(t)
	return &next
}

// runIndexer indexes topics until the test ends, or until the function it
// returns is called, which stops it and waits. Its gauges go on the
// console's Registerer, as idem console does.
func (e *env) runIndexer(t *testing.T, topics ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ix := &index.Indexer{Brokers: e.k.Brokers, Sarama: e.k.SaramaConfig(), Pool: e.pool, Topics: topics, Group: e.k.Group(t, "indexer"), Registerer: e.reg, EncryptionKey: e.kek}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := ix.Run(ctx); err != nil {
			t.Errorf("indexer: %v", err)
		}
	})
	stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(stop)
	return stop
}

// waitIndexed waits until the index holds n records matching f and returns
// them, newest failure first, each as Get reads it.
func (e *env) waitIndexed(t *testing.T, f failidx.Filter, n int) []failidx.Record {
	t.Helper()
	var recs []failidx.Record
	idemtest.Eventually(t, 60*time.Second, func() error {
		page, err := e.store.List(context.Background(), f, "", 500)
		if err != nil {
			return err
		}
		recs = page.Records
		if len(recs) != n {
			return fmt.Errorf("%d records indexed, want %d", len(recs), n)
		}
		return nil
	})
	for i, r := range recs {
		full, err := e.store.Get(context.Background(), r.ID)
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = full
	}
	return recs
}

// dead is one dead letter seedDLQ writes.
type dead struct {
	key     string // idempotency key
	value   []byte
	kind    handler.Kind
	err     string
	stack   string // idem-stack, when set
	headers []sarama.RecordHeader
	group   string // the consumer group that failed; default "billing"
}

// seedDLQ writes dead letters for origin straight into the dead-letter
// topic dlqTopic, in idem's wire format, as consumer.Run would.
func (e *env) seedDLQ(t *testing.T, dlqTopic, origin string, ds ...dead) {
	t.Helper()
	cfg := e.k.SaramaConfig()
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.MaxMessageBytes = 4 << 20
	p, err := sarama.NewSyncProducer(e.k.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	for i, d := range ds {
		group := d.group
		if group == "" {
			group = "billing"
		}
		f := retrytopic.Failure{
			Attempt: 1, OriginalTopic: origin, OriginalPartition: 0, OriginalOffset: int64(i), Group: group,
			Kind: d.kind, ErrorType: "*errors.errorString", Error: d.err, Stack: []byte(d.stack),
			FirstFailureAt: base, LastFailureAt: base.Add(time.Duration(i) * time.Second),
		}
		hs := append([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(d.key)}}, d.headers...)
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: dlqTopic, Partition: 0, Key: sarama.StringEncoder(d.key),
			Value: sarama.ByteEncoder(d.value), Headers: wire.Encode(hs, f)}); err != nil {
			t.Fatal(err)
		}
	}
}

// bigTopic creates a one-partition topic that takes records of up to 4 MiB.
// idemtest creates topics with the broker's default configs only, so this
// one is made with internal/testing/testenv (on the same broker).
func (e *env) bigTopic(t *testing.T) string {
	t.Helper()
	k := testenv.NewKafka(t)
	name := testenv.Unique("t_big_" + t.Name())
	max := "4194304"
	if err := k.Admin(t).CreateTopic(name, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"max.message.bytes": &max}}, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.DeleteTopics(t, name) })
	k.WaitTopic(t, name, 1)
	return name
}

// hwm returns the sum of the high-water marks of each partition of topic.
func (e *env) hwm(t *testing.T, topic string) int64 {
	t.Helper()
	if err := e.client.RefreshMetadata(topic); err != nil {
		t.Fatal(err)
	}
	ps, err := e.client.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, p := range ps {
		off, err := e.client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		sum += off
	}
	return sum
}

// call sends an API request with token ("" for none) and a JSON body (nil
// for none) and returns the status and the body.
func (e *env) call(t *testing.T, method, path, token string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// browserish is an HTTP client with a cookie jar that has logged in to the
// UI with secret.
func (e *env) login(t *testing.T, secret string) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.Get(e.srv.URL + "/login")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp, err = c.PostForm(e.srv.URL+"/login", url.Values{"csrf": {formCSRF(t, page)}, "token": {secret}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path == "/login" {
		t.Fatalf("login: %d at %s", resp.StatusCode, resp.Request.URL)
	}
	return c
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// formCSRF returns the CSRF token of the first form on page.
func formCSRF(t *testing.T, page []byte) string {
	t.Helper()
	m := csrfRE.FindSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the page:\n%s", page)
	}
	return string(m[1])
}

// get fetches a UI page with c.
func (e *env) get(t *testing.T, c *http.Client, path string) (int, []byte) {
	t.Helper()
	resp, err := c.Get(e.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// post posts a UI form with c.
func (e *env) post(t *testing.T, c *http.Client, path string, form url.Values) (int, []byte) {
	t.Helper()
	resp, err := c.PostForm(e.srv.URL+path, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// audit returns the audit log, newest first.
func (e *env) audit(t *testing.T) []failidx.AuditEntry {
	t.Helper()
	es, _, err := e.store.Audit(context.Background(), "", 500)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

func statuses(t *testing.T, e *env, ids ...int64) string {
	t.Helper()
	var s []string
	for _, id := range ids {
		r, err := e.store.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		s = append(s, string(r.Status))
	}
	return strings.Join(s, ",")
}
