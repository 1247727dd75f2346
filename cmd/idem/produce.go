package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"
)

// maxLine caps one line of idem produce's input (one record's key and value).
const maxLine = 16 << 20

// produceBatch is how many records idem produce sends in one SendMessages.
const produceBatch = 500

// produceOpts holds the flags of idem produce.
type produceOpts struct {
	key, keySep, keyHeader string
	headers                []string
	partition              int32
	schema                 schemaOpts // produce_schema.go
}

func newProduceCmd(a *app) *cobra.Command {
	var o produceOpts
	c := &cobra.Command{
		Use:   "produce TOPIC",
		Short: "Produce records to a topic, one per line of stdin",
		Long: `Produce records to TOPIC, one per line of standard input (without its line
end; empty lines are skipped), for trying a consumer out.

The record key is --key for every record, or, with --key-sep, what precedes
the first separator on each line (the value is what follows it); without
either, records have no key. --header k=v (repeatable) adds the same headers
to every record: an idem consumer reads the idempotency key from the
idempotency-key header by default, so --key-sep with --key-header
idempotency-key gives each record its own. --partition sends every record to
one partition; by default the key is hashed (no key: any partition).

With --schema-subject (its latest version) or --schema-id, each value is a
JSON document written in Confluent's wire format with that schema of the
registry (--registry-url, or SCHEMA_REGISTRY_URL): Avro from its JSON
encoding or plain JSON, Protobuf from proto3's JSON mapping (--schema-message
picks the message), JSON Schema validated.

Every line is read and checked before anything is sent, and sends wait for
acks=all (idempotent producer). It prints how many records it produced and
where (partition, first and last offset), and exits 1 when any record failed
(the summary then says which were produced). The topic must exist (idem topic
create).`,
		Example: `  printf 'pay-1:{"amount":10}\npay-2:{"amount":20}\n' | idem produce payments --key-sep : --key-header idempotency-key
  echo '{"order":42}' | idem produce payments --key order-42 --header idempotency-key=order-42 --header source=cli
  seq 1 100 | idem produce numbers --partition 0
  echo 'o-1:{"id":"o-1","cents":1250}' | idem produce orders --key-sep : --key-header idempotency-key --schema-subject orders-value`,
		Args: oneArg("give one topic: idem produce TOPIC < lines"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.produce(cmd.Context(), args[0], o)
		},
	}
	a.kafkaFlags(c)
	f := c.Flags()
	f.StringVarP(&o.key, "key", "k", "", "key of every record")
	f.StringVar(&o.keySep, "key-sep", "", "take each record's key from its line, up to the first SEP (the value is the rest)")
	f.StringArrayVarP(&o.headers, "header", "H", nil, "header key=value on every record (repeatable)")
	f.StringVar(&o.keyHeader, "key-header", "", "also write each record's key into this header (e.g. idempotency-key)")
	f.Int32VarP(&o.partition, "partition", "p", -1, "partition to send every record to; -1: by the key's hash")
	addSchemaFlags(f, &o.schema)
	return c
}

// line is one record read from the input: its line number, key and value.
type line struct {
	n          int
	key, value []byte
}

// readLines reads the records of in as o says, checking every line.
func readLines(in io.Reader, o produceOpts) ([]line, int, error) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	var out []line
	empty := 0
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSuffix(sc.Text(), "\r")
		if text == "" {
			empty++
			continue
		}
		l := line{n: n, value: []byte(text)}
		switch {
		case o.keySep != "":
			k, v, ok := strings.Cut(text, o.keySep)
			if !ok {
				return nil, 0, fmt.Errorf("line %d has no key separator %q (--key-sep): nothing produced", n, o.keySep)
			}
			if k == "" {
				return nil, 0, fmt.Errorf("line %d has an empty key before %q (--key-sep): nothing produced", n, o.keySep)
			}
			l.key, l.value = []byte(k), []byte(v)
		case o.key != "":
			l.key = []byte(o.key)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, 0, fmt.Errorf("line %d is longer than %d MiB: nothing produced", len(out)+empty+1, maxLine>>20)
		}
		return nil, 0, fmt.Errorf("read stdin: nothing produced: %w", err)
	}
	return out, empty, nil
}

// produce sends the lines of a.in to topic as o says and prints a summary.
func (a *app) produce(ctx context.Context, topic string, o produceOpts) error {
	switch {
	case o.key != "" && o.keySep != "":
		return errors.New("give --key (one key for every record) or --key-sep (a key per line), not both")
	case o.partition < -1:
		return fmt.Errorf("--partition %d: must be >= 0, or -1 for the key's hash", o.partition)
	case o.keyHeader != "" && o.key == "" && o.keySep == "":
		return errors.New("--key-header copies each record's key into a header: give --key or --key-sep too")
	}
	kvs, err := parseKV("header", o.headers)
	if err != nil {
		return err
	}
	var hs []sarama.RecordHeader
	for _, kv := range kvs {
		hs = append(hs, sarama.RecordHeader{Key: []byte(kv[0]), Value: []byte(kv[1])})
	}
	lines, empty, err := readLines(a.in, o)
	if err != nil {
		return err
	}
	if len(lines) == 0 {
		return errors.New("no records on stdin (one record per line; empty lines are skipped): nothing produced")
	}
	if lines, err = a.encodeLines(ctx, o.schema, lines); err != nil {
		return err
	}
	cfg, brokers, err := a.saramaConfig()
	if err != nil {
		return err
	}
	// Idempotent with acks=all, as idem's own producers, at the protocol
	// version --kafka-version gives.
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Retry.Max = max(cfg.Producer.Retry.Max, 1)
	cfg.Producer.Partitioner = sarama.NewHashPartitioner
	if o.partition >= 0 {
		cfg.Producer.Partitioner = sarama.NewManualPartitioner
	}
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", strings.Join(brokers, ","), err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		// A topic created a moment ago may not be in every broker's
		// metadata yet: look again for a few seconds before saying it is
		// missing.
		if werr := waitLeaders(ctx, client, topic, 1, 3*time.Second); werr == nil {
			parts, err = client.Partitions(topic)
		}
	}
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return fmt.Errorf("topic %s does not exist (create it: idem topic create %s --partitions N): nothing produced", topic, topic)
	}
	if err != nil {
		return fmt.Errorf("topic %s: nothing produced: %w", topic, err)
	}
	if o.partition >= 0 && !slices.Contains(parts, o.partition) {
		return fmt.Errorf("--partition %d: topic %s has partitions 0-%d: nothing produced", o.partition, topic, len(parts)-1)
	}
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		return fmt.Errorf("producer: nothing produced: %w", err)
	}
	defer p.Close()
	var sum produceSummary
	failed := map[int]error{} // by line number
	for start := 0; start < len(lines) && ctx.Err() == nil; start += produceBatch {
		batch := lines[start:min(start+produceBatch, len(lines))]
		msgs := make([]*sarama.ProducerMessage, len(batch))
		for i, l := range batch {
			m := &sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(l.value), Headers: slices.Clone(hs),
				Metadata: l.n}
			if l.key != nil {
				m.Key = sarama.ByteEncoder(l.key)
				if o.keyHeader != "" {
					m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(o.keyHeader), Value: l.key})
				}
			}
			if o.partition >= 0 {
				m.Partition = o.partition
			}
			msgs[i] = m
		}
		err := p.SendMessages(msgs)
		bad := map[*sarama.ProducerMessage]bool{}
		var perrs sarama.ProducerErrors
		if errors.As(err, &perrs) {
			for _, pe := range perrs {
				bad[pe.Msg] = true
				failed[pe.Msg.Metadata.(int)] = pe.Err
			}
		} else if err != nil {
			return fmt.Errorf("produce to %s: %w (%s)", topic, err, sum.String(topic))
		}
		for _, m := range msgs {
			if !bad[m] {
				sum.add(m.Partition, m.Offset)
			}
		}
	}
	fmt.Fprintln(a.out, sum.String(topic))
	if empty > 0 {
		fmt.Fprintf(a.out, "%s skipped\n", plural(int64(empty), "empty line"))
	}
	switch {
	case len(failed) > 0:
		first := slices.Min(slices.Collect(maps.Keys(failed)))
		return fmt.Errorf("%d of %d records failed (see the summary for those produced); first, line %d: %w",
			len(failed), len(lines), first, failed[first])
	case ctx.Err() != nil:
		return fmt.Errorf("stopped after %d of %d records: %w", sum.total, len(lines), ctx.Err())
	}
	return nil
}

// produceSummary counts produced records per partition with their offset
// range.
type produceSummary struct {
	total int
	parts map[int32]*[3]int64 // count, first offset, last offset
}

func (s *produceSummary) add(p int32, off int64) {
	if s.parts == nil {
		s.parts = map[int32]*[3]int64{}
	}
	s.total++
	r, ok := s.parts[p]
	if !ok {
		s.parts[p] = &[3]int64{1, off, off}
		return
	}
	r[0]++
	r[1], r[2] = min(r[1], off), max(r[2], off)
}

// String says "produced N records to T: partition P offsets A-B (n), …".
func (s *produceSummary) String(topic string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "produced %s to %s", plural(int64(s.total), "record"), topic)
	ps := make([]int32, 0, len(s.parts))
	for p := range s.parts {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	for i, p := range ps {
		r := s.parts[p]
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		if r[1] == r[2] {
			fmt.Fprintf(&b, "%spartition %d offset %d", sep, p, r[1])
		} else {
			fmt.Fprintf(&b, "%spartition %d offsets %d-%d (%d records)", sep, p, r[1], r[2], r[0])
		}
	}
	return b.String()
}
