package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/internal/testing/chaos/check"
)

// downstreamSchema is the downstream service's ledger: one row per applied
// payment.recorded event, no unique key, so an event applied twice shows.
const downstreamSchema = `
CREATE TABLE IF NOT EXISTS chaos_downstream (
	id          bigserial PRIMARY KEY,
	event_id    text NOT NULL,
	payment_key text NOT NULL,
	at          timestamptz NOT NULL DEFAULT clock_timestamp()
);`

// downstream is an idem consumer of the events topic, as another service
// would run it: the relay's idempotency-key header (the event id) is its
// inbox key, and each event writes one ledger row in the inbox's
// transaction. It runs in the harness's process, through the same broker and
// PostgreSQL faults as the members, but is never killed.
type downstream struct {
	cancel context.CancelFunc
	done   chan error
	log    string // its log file
	start  time.Time
}

// startDownstream starts the consumer of topic as group.
func startDownstream(ctx context.Context, brokers []string, pool *pgxpool.Pool, topic, group, logPath string) (*downstream, error) {
	if _, err := pool.Exec(ctx, downstreamSchema); err != nil {
		return nil, fmt.Errorf("downstream ledger: %w", err)
	}
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cfg := consumer.Config{
		Brokers: brokers, Group: group, Topics: []string{topic},
		Dedupe: dedupe.NewPostgres(pool), Sarama: saramaConfig(),
		Logger:           slog.New(slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelInfo})),
		DLQDepthInterval: -1,
	}
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		var ev struct {
			Key string `json:"idempotency_key"`
		}
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			return handler.Decode(err)
		}
		id, _ := m.Header(outboxstore.HeaderID)
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO chaos_downstream (event_id, payment_key) VALUES ($1, $2)`, string(id), ev.Key)
		return err
	})
	rctx, cancel := context.WithCancel(ctx)
	d := &downstream{cancel: cancel, done: make(chan error, 1), log: logPath, start: time.Now()}
	go func() {
		err := consumer.Run(rctx, cfg, h)
		lf.Close()
		d.done <- err
	}()
	return d, nil
}

// stop stops the consumer and returns its record as a process.
func (d *downstream) stop(faults []check.Fault) check.Proc {
	d.cancel()
	err := <-d.done
	p := check.Proc{Name: "downstream", Start: d.start, End: time.Now()}
	if err != nil {
		p.ExitCode = 1
		p.Problems = append(p.Problems, "consumer.Run: "+err.Error())
	}
	p.Problems = append(p.Problems, scanStderr(d.log, faults, errorGrace, nil)...)
	return p
}

// gatherEvents builds the outbox invariant's input: for every stored
// payment (and every payment an event names), the copies on the events
// topic, the distinct event ids and the downstream ledger rows.
func gatherEvents(ctx context.Context, brokers []string, pool *pgxpool.Pool, topic string, payments []check.Payment, committed bool) ([]check.Event, error) {
	byKey := map[string]*check.Event{}
	ids := map[string]map[string]bool{}
	ev := func(key string) *check.Event {
		e, ok := byKey[key]
		if !ok {
			e = &check.Event{Key: key}
			byKey[key] = e
			ids[key] = map[string]bool{}
		}
		return e
	}
	for _, p := range payments {
		ev(p.Key).Stored = true
	}
	recs, err := readAll(brokers, topic, committed)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		var body struct {
			Key string `json:"idempotency_key"`
		}
		_ = json.Unmarshal(r.value, &body)
		e := ev(body.Key)
		e.Published++
		ids[body.Key][r.headers[outboxstore.HeaderID]] = true
	}
	rows, err := pool.Query(ctx, `SELECT payment_key, count(*) FROM chaos_downstream GROUP BY payment_key`)
	if err != nil {
		return nil, fmt.Errorf("read chaos_downstream: %w", err)
	}
	var key string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&key, &n}, func() error { ev(key).Applied = n; return nil }); err != nil {
		return nil, fmt.Errorf("read chaos_downstream: %w", err)
	}
	out := make([]check.Event, 0, len(byKey))
	for k, e := range byKey {
		e.IDs = len(ids[k])
		out = append(out, *e)
	}
	return out, nil
}

// outboxLeft counts the outbox rows not published (pending or failed).
func outboxLeft(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_outbox WHERE state <> 'published'`).Scan(&n)
	return n, err
}
