package main

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

// This file is the member's hooks: a history of every handler call, an
// effects ledger written in the message's transaction, and injected
// transient failures.

// Attempt is one line of a member's history file: one call of the handler
// for one message, and what the handler returned. "ok" only means the
// handler returned nil: whether its transaction committed is what the
// chaos_effects table (and the payments table) say.
type Attempt struct {
	Member    string    `json:"member"`            // the -member name
	Mode      string    `json:"mode"`              // the -mode
	Topic     string    `json:"topic"`             // where the record was read (a retry tier too)
	Partition int32     `json:"partition"`         //
	Offset    int64     `json:"offset"`            //
	Key       string    `json:"key"`               // idempotency key
	KafkaKey  string    `json:"kafka_key"`         // record key
	Seq       int64     `json:"seq"`               // the producer's chaos-seq header, -1 when absent
	Attempt   int       `json:"attempt"`           // handler.Message.Attempt
	Batch     int       `json:"batch"`             // messages in the handler call (1 outside batch handlers)
	Outcome   string    `json:"outcome"`           // "ok" or the handler.ErrorKind of the error
	Error     string    `json:"error,omitempty"`   // the handler's error text
	Start     time.Time `json:"start"`             // handler call began
	End       time.Time `json:"end"`               // handler call returned
	Injected  bool      `json:"injected,omitzero"` // the failure was injected by -fail-header
}

// historyLog appends Attempts as JSON lines to a file. Lines are buffered and
// written with fsync every flushEvery, and at Close: a SIGKILLed member loses
// at most the lines of its last flushEvery. The chaos checker uses histories
// for timelines only, never as proof of an effect.
type historyLog struct {
	mu   sync.Mutex
	f    *os.File
	w    *bufio.Writer
	err  error // first write error, reported by Close
	stop chan struct{}
	done chan struct{}
}

// flushEvery is how often the history is written and synced.
const flushEvery = 100 * time.Millisecond

// openHistory opens (appending) or creates path.
func openHistory(path string) (*historyLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	h := &historyLog{f: f, w: bufio.NewWriterSize(f, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
	go h.flusher()
	return h, nil
}

func (h *historyLog) flusher() {
	defer close(h.done)
	t := time.NewTicker(flushEvery)
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

func (h *historyLog) flushLocked() {
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

// add appends one attempt.
func (h *historyLog) add(a Attempt) {
	b, err := json.Marshal(a)
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
func (h *historyLog) Close() error {
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

// effectsSchema is the chaos ledger: one row per handler success, written in
// the message's transaction with no unique key, so a message applied twice
// shows as two rows (payments.idempotency_key is UNIQUE and would hide it).
const effectsSchema = `
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

// recorder wraps the payment handlers with the chaos hooks.
type recorder struct {
	member, mode string
	failHeader   string // header whose integer value N fails a message's first N attempts
	log          *historyLog
}

// attempt builds the history line of m.
func (r *recorder) attempt(m *handler.Message, batch int, start time.Time, err error, injected bool) Attempt {
	a := Attempt{
		Member: r.member, Mode: r.mode, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
		Key: m.IdempotencyKey, KafkaKey: string(m.Key), Seq: seqOf(m), Attempt: m.Attempt, Batch: batch,
		Outcome: outcomeOf(err), Start: start, End: time.Now(), Injected: injected,
	}
	if err != nil {
		a.Error = err.Error()
	}
	return a
}

// seqOf is the producer's sequence number of m, or -1.
func seqOf(m *handler.Message) int64 {
	v, ok := m.Header("chaos-seq")
	if !ok {
		return -1
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// outcomeOf names a handler result the way the checker reads it.
func outcomeOf(err error) string {
	if err == nil {
		return "ok"
	}
	return string(handler.ErrorKind(err))
}

// injectedFailure returns a retriable error while m's attempt is within the
// count its fail header asks for.
func (r *recorder) injectedFailure(m *handler.Message) error {
	if r.failHeader == "" {
		return nil
	}
	v, ok := m.Header(r.failHeader)
	if !ok {
		return nil
	}
	n, err := strconv.Atoi(string(v))
	if err != nil || m.Attempt > n {
		return nil
	}
	return fmt.Errorf("injected failure %d of %d (%s header)", m.Attempt, n, r.failHeader)
}

// errNoTx is returned when the handler runs without the inbox's transaction.
var errNoTx = errors.New("no transaction in the handler's context: Config.Dedupe must be dedupe.NewPostgres(pool)")

// effect writes m's ledger row in the transaction of ctx.
func (r *recorder) effect(ctx context.Context, m *handler.Message) error {
	if !dedupe.HasTx(ctx) {
		return errNoTx
	}
	tx := dedupe.Tx(ctx)
	_, err := tx.Exec(ctx, `INSERT INTO chaos_effects (idempotency_key, kafka_key, seq, member, topic, kpartition, koffset, attempt)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		m.IdempotencyKey, string(m.Key), seqOf(m), r.member, m.Topic, m.Partition, m.Offset, m.Attempt)
	if err != nil {
		return fmt.Errorf("chaos ledger %s: %w", m.IdempotencyKey, err)
	}
	return nil
}

// wrap returns h with the hooks: injected failures first, then h, then the
// ledger row, and one history line per call.
func (r *recorder) wrap(h handler.Handler) handler.Handler {
	return handler.Func(func(ctx context.Context, m *handler.Message) error {
		start := time.Now()
		err := r.injectedFailure(m)
		injected := err != nil
		if err == nil {
			err = h.Handle(ctx, m)
		}
		if err == nil {
			err = r.effect(ctx, m)
		}
		r.log.add(r.attempt(m, 1, start, err, injected))
		return err
	})
}

// wrapBatch is wrap for a batch handler: injected failures are reported in a
// *handler.BatchError without calling h for those messages.
func (r *recorder) wrapBatch(h handler.BatchHandler) handler.Handler {
	return handler.Batch(func(ctx context.Context, msgs []*handler.Message) error {
		start := time.Now()
		injected := map[*handler.Message]error{}
		rest := make([]*handler.Message, 0, len(msgs))
		for _, m := range msgs {
			if err := r.injectedFailure(m); err != nil {
				injected[m] = err
				continue
			}
			rest = append(rest, m)
		}
		var err error
		if len(rest) > 0 {
			err = h.HandleBatch(ctx, rest)
		}
		failed := map[*handler.Message]error{}
		var be *handler.BatchError
		if errors.As(err, &be) {
			for _, f := range be.Failed {
				failed[f.Message] = f.Err
			}
			err = nil
		}
		if err == nil && len(failed) == 0 && len(injected) == 0 {
			for _, m := range rest {
				if err = r.effect(ctx, m); err != nil {
					break
				}
			}
		}
		for _, m := range msgs {
			merr, inj := injected[m]
			switch {
			case inj:
			case failed[m] != nil:
				merr = failed[m]
			default:
				merr = err
			}
			r.log.add(r.attempt(m, len(msgs), start, merr, inj))
		}
		if err != nil {
			return err
		}
		if len(failed)+len(injected) > 0 {
			be := &handler.BatchError{}
			for _, m := range msgs {
				if e, ok := injected[m]; ok {
					be.Add(m, e)
				} else if e := failed[m]; e != nil {
					be.Add(m, e)
				}
			}
			return be
		}
		return nil
	})
}
