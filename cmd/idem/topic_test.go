package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/idemtest"
)

// TestTopicCreateAndProduce walks a newcomer's path: create a topic, produce
// three lines with keys and headers, and read them back from Kafka.
func TestTopicCreateAndProduce(t *testing.T) {
	k := idemtest.Connect(t)
	// The CLI creates the topic: its name hangs under a test topic, which
	// takes it along when it is deleted.
	topic := k.Topic(t, "t", 1) + ".create_produce"

	code, out, _ := idem(t, k, "", "topic", "create", topic, "--partitions", "2", "--replication-factor", "1",
		"--config", "retention.ms=3600000")
	if code != 0 || !strings.Contains(out, "created topic "+topic+": 2 partitions, replication factor 1, config retention.ms=3600000") {
		t.Fatalf("create: code %d\n%s", code, out)
	}
	//lint:ignore SA1019 DescribeConfig is the call sarama's admin offers for one resource; fine in a test
	entries, err := admin(t, k).DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"retention.ms"}})
	if err != nil || len(entries) != 1 || entries[0].Value != "3600000" {
		t.Errorf("retention.ms: %+v, %v; want 3600000", entries, err)
	}

	// The same name again: a clear error, unless --if-not-exists.
	code, out, errOut := idem(t, k, "", "topic", "create", topic, "--partitions", "2")
	if code != 1 || out != "" || !strings.Contains(errOut, "topic "+topic+" already exists") || !strings.Contains(errOut, "--if-not-exists") {
		t.Errorf("create again: code %d, stderr %q", code, errOut)
	}
	code, out, _ = idem(t, k, "", "topic", "create", topic, "--partitions", "4", "--if-not-exists")
	if code != 0 || !strings.Contains(out, "already exists (2 partitions); nothing changed") {
		t.Errorf("create --if-not-exists: code %d\n%s", code, out)
	}

	in := "pay-1:{\"amount\":10}\npay-2:{\"amount\":20}\r\n\npay-3:{\"amount\":30}\n"
	code, out, _ = idem(t, k, in, "produce", topic, "--key-sep", ":", "--key-header", "idempotency-key",
		"--header", "source=cli", "-H", "trace=a=b")
	if code != 0 || !strings.Contains(out, "produced 3 records to "+topic+": partition ") || !strings.Contains(out, "1 empty line skipped") {
		t.Fatalf("produce: code %d\n%s", code, out)
	}
	type rec struct{ key, value, ikey, source, trace string }
	var got []rec
	for p := int32(0); p < 2; p++ {
		for _, m := range readPartition(t, k, topic, p) {
			r := rec{key: string(m.Key), value: string(m.Value)}
			r.ikey, _ = hdr(m, "idempotency-key")
			r.source, _ = hdr(m, "source")
			r.trace, _ = hdr(m, "trace")
			got = append(got, r)
		}
	}
	slices.SortFunc(got, func(a, b rec) int { return strings.Compare(a.key, b.key) })
	want := []rec{
		{"pay-1", `{"amount":10}`, "pay-1", "cli", "a=b"},
		{"pay-2", `{"amount":20}`, "pay-2", "cli", "a=b"},
		{"pay-3", `{"amount":30}`, "pay-3", "cli", "a=b"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("read back %+v\nwant %+v", got, want)
	}

	// A fixed key to one partition: the summary names it and its offset.
	code, out, _ = idem(t, k, "x\n", "produce", topic, "--key", "k", "--partition", "1")
	if code != 0 || !strings.Contains(out, "produced 1 record to "+topic+": partition 1 offset ") {
		t.Errorf("produce --partition 1: code %d\n%s", code, out)
	}
}

// TestTopicProduceBadInput: bad flag values and input fail with one clear
// line, and nothing is created or produced.
func TestTopicProduceBadInput(t *testing.T) {
	k := idemtest.Connect(t)
	topic := k.Topic(t, "t", 1)
	missing := topic + ".missing" // deleted with topic, in case a case wrongly creates it
	tests := []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{"no partitions", "", []string{"topic", "create", missing}, "--partitions is required"},
		{"zero partitions", "", []string{"topic", "create", missing, "-p", "0"}, "--partitions 0: must be >= 1"},
		{"bad replication", "", []string{"topic", "create", missing, "-p", "1", "--replication-factor", "0"}, "--replication-factor 0"},
		{"not a number", "", []string{"topic", "create", missing, "-p", "two"}, `invalid argument "two"`},
		{"config without =", "", []string{"topic", "create", missing, "-p", "1", "--config", "retention.ms"}, `--config "retention.ms": want key=value`},
		{"unknown config", "", []string{"topic", "create", missing, "-p", "1", "--config", "no.such.config=1"}, "Unknown topic config name: no.such.config"},
		{"no name", "", []string{"topic", "create", "-p", "1"}, "give one topic name"},
		{"produce to a missing topic", "a\n", []string{"produce", missing}, "topic " + missing + " does not exist (create it: idem topic create"},
		{"key and key-sep", "a:b\n", []string{"produce", topic, "--key", "k", "--key-sep", ":"}, "not both"},
		{"line without separator", "a:1\nb\n", []string{"produce", topic, "--key-sep", ":"}, `line 2 has no key separator ":"`},
		{"empty key", ":1\n", []string{"produce", topic, "--key-sep", ":"}, "line 1 has an empty key"},
		{"header without =", "a\n", []string{"produce", topic, "--header", "source"}, `--header "source": want key=value`},
		{"partition out of range", "a\n", []string{"produce", topic, "--partition", "3"}, "--partition 3: topic " + topic + " has partitions 0-0"},
		{"negative partition", "a\n", []string{"produce", topic, "--partition", "-2"}, "--partition -2"},
		{"key-header without a key", "a\n", []string{"produce", topic, "--key-header", "idempotency-key"}, "give --key or --key-sep"},
		{"nothing on stdin", "\n\n", []string{"produce", topic}, "no records on stdin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := idem(t, k, tt.stdin, tt.args...)
			if code != 1 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tt.want) {
				t.Errorf("code %d, stdout %q, stderr %q: want exit 1 and one line with %q", code, out, errOut, tt.want)
			}
		})
	}
	// A record the broker refuses (over the topic's max.message.bytes): the
	// summary says what was produced (line 1, unless the broker refused the
	// batch holding both), and the command fails naming the first bad line.
	small := topic + ".small" // deleted with topic
	if code, _, _ := idem(t, k, "", "topic", "create", small, "-p", "1", "--config", "max.message.bytes=200"); code != 0 {
		t.Fatalf("create %s: code %d", small, code)
	}
	code, out, errOut := idem(t, k, "x\n"+strings.Repeat("y", 400)+"\n", "produce", small, "--partition", "0")
	if code != 1 || !strings.Contains(out, "produced ") || !strings.Contains(errOut, "records failed") ||
		!strings.Contains(errOut, "of 2 records failed") || !strings.Contains(errOut, "too large") {
		t.Errorf("produce over max.message.bytes: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	if got := readPartition(t, k, topic, 0); len(got) != 0 {
		t.Errorf("%d records were produced by failed commands", len(got))
	}
	topics, err := admin(t, k).ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := topics[missing]; ok {
		t.Errorf("a failed command created %s", missing)
	}
}

// TestTopicDelete: idem topic delete deletes exactly the topics named,
// after saying what they hold and asking (unless --yes); it refuses
// Kafka's internal topics and names it does not find, and deletes nothing
// then.
func TestTopicDelete(t *testing.T) {
	k := idemtest.Connect(t)
	base := k.Topic(t, "t", 1) // what the test leaves is deleted with it
	a, b := base+".delete_a", base+".delete_b"
	for _, name := range []string{a, b} {
		if code, _, _ := idem(t, k, "", "topic", "create", name, "-p", "2"); code != 0 {
			t.Fatalf("create %s: code %d", name, code)
		}
	}
	exists := func(name string) bool {
		topics, err := admin(t, k).ListTopics()
		if err != nil {
			t.Fatal(err)
		}
		_, ok := topics[name]
		return ok
	}
	code, out, errOut := idem(t, k, "n\n", "topic", "delete", a)
	if code != 1 || !strings.Contains(out, a) || !strings.Contains(out, "2 partitions") || !strings.Contains(errOut, "not confirmed") || !exists(a) {
		t.Errorf("delete answered n: code %d\n%s\n%s", code, out, errOut)
	}
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"topic", "delete", "__consumer_offsets", "--yes"}, "internal"},
		{[]string{"topic", "delete", a, base + ".no_such_topic", "--yes"}, "no_such_topic"},
		{[]string{"topic", "delete", "--yes"}, "name the topics"},
	} {
		if code, _, errOut := idem(t, k, "", c.args...); code != 1 || !strings.Contains(errOut, c.says) {
			t.Errorf("idem %s: code %d, %q; want refused saying %q", strings.Join(c.args, " "), code, errOut, c.says)
		}
	}
	if !exists(a) || !exists("__consumer_offsets") {
		t.Fatal("a refused delete deleted a topic")
	}
	if code, out, _ := idem(t, k, "y\n", "topic", "delete", a); code != 0 || !strings.Contains(out, "deleted topic "+a) || exists(a) {
		t.Errorf("delete answered y: code %d\n%s", code, out)
	}
	if code, out, _ := idem(t, k, "", "topic", "delete", b, "--yes"); code != 0 || !strings.Contains(out, "deleted topic "+b) || exists(b) {
		t.Errorf("delete --yes: code %d\n%s", code, out)
	}
}
