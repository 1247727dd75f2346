package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/testing/chaos/check"
)

// This file reads a run's outcome back for the checker: the effects ledger,
// payments and orders from PostgreSQL, the dead-letter topic and the retry
// tiers from Kafka, and the members' history files.

// gather reads the run's outcome: the ledger, payments and orders from
// PostgreSQL, the DLQ and the lags from Kafka, the members' histories.
func gather(ctx context.Context, brokers []string, pool *pgxpool.Pool, mode string, sources []lagSource, dir string, committed bool) (*check.History, error) {
	h := &check.History{Mode: mode, Orders: map[string]string{}}
	var err error
	if h.Effects, err = readEffects(ctx, pool); err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT idempotency_key, order_id FROM payments`)
	if err != nil {
		return nil, err
	}
	h.Payments, err = pgx.CollectRows(rows, pgx.RowToStructByPos[check.Payment])
	if err != nil {
		return nil, fmt.Errorf("read payments: %w", err)
	}
	rows, err = pool.Query(ctx, `SELECT id, status FROM orders`)
	if err != nil {
		return nil, err
	}
	var id, status string
	if _, err := pgx.ForEachRow(rows, []any{&id, &status}, func() error { h.Orders[id] = status; return nil }); err != nil {
		return nil, fmt.Errorf("read orders: %w", err)
	}
	if h.DLQ, err = readDLQ(brokers, sources[0].topics[0]+"."+sources[0].group+".dlq", committed); err != nil {
		return nil, err
	}
	if h.Lags, err = leftOver(ctx, brokers, pool, sources, stores{ordering: mode == "ordering"}); err != nil {
		return nil, err
	}
	if h.Attempts, err = readHistories(dir); err != nil {
		return nil, err
	}
	return h, nil
}

// readEffects reads the chaos_effects ledger.
func readEffects(ctx context.Context, pool *pgxpool.Pool) ([]check.Effect, error) {
	rows, err := pool.Query(ctx, `SELECT id, idempotency_key, kafka_key, seq, member, topic, kpartition, koffset, attempt, at FROM chaos_effects`)
	if err != nil {
		return nil, err
	}
	es, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (check.Effect, error) {
		var e check.Effect
		err := r.Scan(&e.ID, &e.Key, &e.KafkaKey, &e.Seq, &e.Member, &e.Topic, &e.Partition, &e.Offset, &e.Attempt, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read chaos_effects: %w", err)
	}
	return es, nil
}

// readHistories reads the members' history files in dir.
func readHistories(dir string) ([]check.Attempt, error) {
	var all []check.Attempt
	files, _ := filepath.Glob(filepath.Join(dir, "*.history.jsonl"))
	for _, f := range files {
		as, err := readJSONLines[check.Attempt](f)
		if err != nil {
			return nil, err
		}
		all = append(all, as...)
	}
	return all, nil
}

// rawRecord is one record read back from a topic.
type rawRecord struct {
	partition int32
	offset    int64
	value     []byte
	headers   map[string]string // the last value of each header
}

// readDLQ reads every record of the dead-letter topic (or a retry tier),
// as a read_committed reader gets them when committed.
func readDLQ(brokers []string, dlq string, committed bool) ([]check.DLQRecord, error) {
	recs, err := readAll(brokers, dlq, committed)
	if err != nil {
		return nil, err
	}
	out := make([]check.DLQRecord, 0, len(recs))
	for _, r := range recs {
		d := check.DLQRecord{Partition: r.partition, Offset: r.offset, Seq: -1, Headers: r.headers}
		if s, ok := r.headers["chaos-seq"]; ok {
			fmt.Sscan(s, &d.Seq)
		}
		out = append(out, d)
	}
	return out, nil
}

// readAll reads every record of topic (none if it does not exist): as a
// read_committed reader gets them when committed (readCommitted), else
// all of them.
func readAll(brokers []string, topic string, committed bool) ([]rawRecord, error) {
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	topics, err := client.Topics()
	if err != nil || !slices.Contains(topics, topic) {
		return nil, err
	}
	if committed {
		return readTopicCommitted(client, topic)
	}
	return readTopic(client, topic)
}

// readTopic reads every record of topic.
func readTopic(client sarama.Client, topic string) ([]rawRecord, error) {
	c, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ps, err := client.Partitions(topic)
	if err != nil {
		return nil, err
	}
	var out []rawRecord
	for _, p := range ps {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, err
		}
		if end == 0 {
			continue
		}
		pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, err
		}
		for {
			var m *sarama.ConsumerMessage
			select {
			case m = <-pc.Messages():
			case <-time.After(30 * time.Second):
				pc.Close()
				return nil, fmt.Errorf("reading %s/%d: no record for 30s before offset %d", topic, p, end)
			}
			r := rawRecord{partition: p, offset: m.Offset, value: m.Value, headers: map[string]string{}}
			for _, hd := range m.Headers {
				r.headers[string(hd.Key)] = string(hd.Value)
			}
			out = append(out, r)
			if m.Offset+1 >= end {
				break
			}
		}
		pc.Close()
	}
	return out, nil
}

// readJSONLines decodes a JSON-lines file; a torn last line (a SIGKILLed
// writer) is skipped.
func readJSONLines[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var v T
		if json.Unmarshal(sc.Bytes(), &v) == nil {
			out = append(out, v)
		}
	}
	return out, sc.Err()
}
