// Package memberkit is what the chaos harness's member programs share: the
// history file of handler calls and the effects ledger, written in the
// message's transaction. internal/testing/chaos/member (the payments example with
// hooks) and internal/testing/chaos/swarmmember (the swarm's configurable member)
// use it; internal/testing/chaos reads what they write.
package memberkit

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
)

// HistoryLog appends lines as JSON to a file. Lines are buffered and
// written with fsync every FlushEvery, and at Close: a SIGKILLed member
// loses at most the lines of its last FlushEvery. The chaos checker uses
// histories for timelines and for what only a handler sees (origins, calls
// in flight), never as proof of an effect.
type HistoryLog struct {
	mu   sync.Mutex
	f    *os.File
	w    *bufio.Writer
	err  error // first write error, reported by Close
	stop chan struct{}
	done chan struct{}
}

// FlushEvery is how often the history is written and synced.
const FlushEvery = 100 * time.Millisecond

// OpenHistory opens (appending) or creates path.
func OpenHistory(path string) (*HistoryLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	h := &HistoryLog{f: f, w: bufio.NewWriterSize(f, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
	go h.flusher()
	return h, nil
}

func (h *HistoryLog) flusher() {
	defer close(h.done)
	t := time.NewTicker(FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			h.mu.Lock()
			h.flushLocked()
			h.mu.Unlock()
		}
	}
}

func (h *HistoryLog) flushLocked() {
	if h.w.Buffered() == 0 {
		return
	}
	if err := h.w.Flush(); err != nil && h.err == nil {
		h.err = err
	}
	if err := h.f.Sync(); err != nil && h.err == nil {
		h.err = err
	}
}

// Add appends v as one line.
func (h *HistoryLog) Add(v any) {
	b, err := json.Marshal(v)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		if h.err == nil {
			h.err = err
		}
		return
	}
	_, _ = h.w.Write(append(b, '\n'))
}

// Close writes what is buffered, syncs and closes the file.
func (h *HistoryLog) Close() error {
	close(h.stop)
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	h.flushLocked()
	if err := h.f.Close(); err != nil && h.err == nil {
		h.err = err
	}
	if h.err != nil {
		return fmt.Errorf("history: %w", h.err)
	}
	return nil
}

// EffectsSchema is the chaos ledger: one row per handler success, written in
// the message's transaction with no unique key, so a message applied twice
// shows as two rows (a business table's unique key would hide it).
const EffectsSchema = `
CREATE TABLE IF NOT EXISTS chaos_effects (
	id              bigserial PRIMARY KEY,
	idempotency_key text NOT NULL,
	kafka_key       text NOT NULL,
	seq             bigint NOT NULL,
	member          text NOT NULL,
	topic           text NOT NULL,
	kpartition      int NOT NULL,
	koffset         bigint NOT NULL,
	attempt         int NOT NULL,
	at              timestamptz NOT NULL DEFAULT clock_timestamp()
);`

// SeqHeader is the producer's sequence number of each record it sends.
const SeqHeader = "chaos-seq"

// Seq is the producer's sequence number of m, or -1.
func Seq(m *handler.Message) int64 {
	v, ok := m.Header(SeqHeader)
	if !ok {
		return -1
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// ErrNoTx is returned when the handler runs without the inbox's transaction.
var ErrNoTx = errors.New("no transaction in the handler's context: Config.Dedupe must be dedupe.NewPostgres(pool)")

// Effect writes m's ledger row, by member, in the transaction of ctx.
func Effect(ctx context.Context, member string, m *handler.Message) error {
	if !dedupe.HasTx(ctx) {
		return ErrNoTx
	}
	_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO chaos_effects (idempotency_key, kafka_key, seq, member, topic, kpartition, koffset, attempt)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		m.IdempotencyKey, string(m.Key), Seq(m), member, m.Topic, m.Partition, m.Offset, m.Attempt)
	if err != nil {
		return fmt.Errorf("chaos ledger %s: %w", m.IdempotencyKey, err)
	}
	return nil
}
