package outbox_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/outbox"
)

// proxy is a TCP proxy to target that a test switches on and off: while it
// is down it accepts and closes every connection at once (a server that is
// not there yet), while it is up it forwards them.
type proxy struct {
	ln      net.Listener
	target  string
	up      atomic.Bool
	refused atomic.Int64
	mu      sync.Mutex
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.up.Load() {
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

func (p *proxy) forward(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, s)
	p.mu.Unlock()
	var once sync.Once
	closeBoth := func() { once.Do(func() { _ = c.Close(); _ = s.Close() }) }
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(s, c); closeBoth() })
	wg.Go(func() { _, _ = io.Copy(c, s); closeBoth() })
	wg.Wait()
}

// run is a relay's Run in the background: err is set before done closes.
type run struct {
	done chan struct{}
	err  error
}

// waitRefused waits until p has turned away at least n connections, failing
// at once if the relay's Run has returned meanwhile.
func waitRefused(t *testing.T, p *proxy, n int64, what string, rn *run) {
	t.Helper()
	idemtest.Eventually(t, 60*time.Second, func() error {
		select {
		case <-rn.done:
			t.Fatalf("relay.Run returned while %s was unreachable: %v", what, rn.err)
		default:
		}
		if got := p.refused.Load(); got < n {
			return fmt.Errorf("%s refused %d of %d connections", what, got, n)
		}
		return nil
	})
}

// TestRelayStartsOnceDatabaseAndBrokersAnswer: a relay started while its
// database and then its brokers are unreachable (as Run inside consumer.Run
// is when a service starts during an outage) keeps retrying its start-up
// steps (migration, then the producer) and publishes once both answer.
func TestRelayStartsOnceDatabaseAndBrokersAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	recs := e.consume(e.topic)

	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	pg := newProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(pg.addr())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.RuntimeParams["search_path"] = e.schema
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	kafka := newProxy(t, e.k.Brokers[0])

	r, reg := e.relay(pool)
	r.Brokers = []string{kafka.addr()}
	r.LeaderRetry = 20 * time.Millisecond
	r.Health = &outbox.Health{}
	ctx, cancel := context.WithCancel(context.Background())
	rn := &run{done: make(chan struct{})}
	go func() { defer close(rn.done); rn.err = r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-rn.done
		if rn.err != nil {
			t.Errorf("relay.Run: %v", rn.err)
		}
	})
	e.enqueue(e.msg("k", "1"))

	waitRefused(t, pg, 3, "the database", rn)
	pg.up.Store(true)
	waitRefused(t, kafka, 3, "the broker", rn)
	if l := metric(t, reg, "idem_outbox_leader", "idem_outbox"); l != 0 {
		t.Fatalf("idem_outbox_leader = %v before the relay could start", l)
	}
	if err := r.Health.Err(); err == nil {
		t.Fatal("Health.Err() is nil while the brokers are unreachable")
	}
	kafka.up.Store(true)
	e.enqueue(e.msg("k", "2"))
	recs.waitKeys(t, "k")
	idemtest.Eventually(t, 30*time.Second, func() error {
		if got := recs.values("k"); len(got) != 2 || got[0] != "1" || got[1] != "2" {
			return fmt.Errorf("records of k: %v, want [1 2]", got)
		}
		return nil
	})
	if err := r.Health.Err(); err != nil {
		t.Fatalf("Health.Err() = %v while the relay publishes", err)
	}
}
