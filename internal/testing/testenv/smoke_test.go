package testenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestSmokeKafka proves the harness broker is real enough: a record produced
// through sarama is consumed back through a consumer group, with its offset
// committed.
func TestSmokeKafka(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 3)
	p := k.Producer(t)
	want := map[string]bool{}
	for i := range 9 {
		v := fmt.Sprintf("v%d", i)
		want[v] = true
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: int32(i % 3), Value: sarama.StringEncoder(v)}); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	cfg := k.SaramaConfig()
	g, err := sarama.NewConsumerGroup(k.Brokers, testenv.Group(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	ctx, cancel := context.WithTimeout(testenv.Context(t), 60*time.Second)
	defer cancel()
	got := make(chan string, 100)
	h := &collect{out: got}
	done := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{topic}, h); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for len(want) > 0 {
		select {
		case v := <-got:
			delete(want, v)
		case <-ctx.Done():
			t.Fatalf("timed out; still missing %v", want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consume: %v", err)
	}
}

type collect struct{ out chan<- string }

func (*collect) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (*collect) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (c *collect) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			c.out <- string(m.Value)
			s.MarkMessage(m, "")
		case <-s.Context().Done():
			return nil
		}
	}
}

// TestSmokePostgres round-trips a row through pgx in a per-test schema.
func TestSmokePostgres(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := testenv.Context(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE smoke(id int primary key, v text not null)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO smoke VALUES (1, 'hello')`); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := pool.QueryRow(ctx, `SELECT v FROM smoke WHERE id = 1`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != "hello" {
		t.Fatalf("got %q, want hello", v)
	}
}
