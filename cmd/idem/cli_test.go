package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// idem runs the CLI in process and returns its exit code, stdout and stderr.
func idem(t *testing.T, k *testenv.Kafka, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append([]string{"--brokers", strings.Join(k.Brokers, ",")}, args...)
	code := run(args, strings.NewReader(stdin), &out, &errOut)
	t.Logf("idem %s -> %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// seed writes n dead-letter records for origin into topic: even ones fail
// with a timeout, odd ones with a decode error.
func seed(t *testing.T, k *testenv.Kafka, topic, origin string, n int) {
	t.Helper()
	p := k.Producer(t)
	base := time.UnixMilli(1_700_000_000_000)
	for i := range n {
		f := retrytopic.Failure{
			Attempt: 2, OriginalTopic: origin, OriginalPartition: 0, OriginalOffset: int64(i), Group: "billing",
			Kind: handler.KindTimeout, ErrorType: "*context.deadlineExceededError", Error: fmt.Sprintf("call ledger for order %d: deadline exceeded", i),
			FirstFailureAt: base, LastFailureAt: base.Add(time.Duration(i) * time.Second),
		}
		if i%2 == 1 {
			f.Kind, f.ErrorType, f.Error = handler.KindDecode, "*json.SyntaxError", fmt.Sprintf("decode: invalid character at offset %d", i)
		}
		hs := retrytopic.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(fmt.Sprint("key-", i))}}, f)
		_, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: 0, Key: sarama.StringEncoder(fmt.Sprint("k", i)),
			Value: sarama.StringEncoder(fmt.Sprintf(`{"order":%d}`, i)), Headers: hs})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestCLIEndToEnd(t *testing.T) {
	k := testenv.NewKafka(t)
	topic, origin := k.Topic(t, 1), k.Topic(t, 1)
	seed(t, k, topic, origin, 4)

	code, out, _ := idem(t, k, "", "dlq", "list", "--topic", topic)
	if code != 0 || !strings.Contains(out, "FINGERPRINT") || !strings.Contains(out, "depth: 4 pending") ||
		!strings.Contains(out, "timeout") || !strings.Contains(out, "decode") {
		t.Fatalf("list: code %d\n%s", code, out)
	}

	code, out, _ = idem(t, k, "", "dlq", "list", "--topic", topic, "--json")
	var listed struct {
		Depth  int64 `json:"depth"`
		Groups []struct {
			Fingerprint string `json:"fingerprint"`
			Count       int64  `json:"count"`
			Kind        string `json:"kind"`
		} `json:"groups"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || listed.Depth != 4 || len(listed.Groups) != 2 || listed.Groups[0].Count != 2 {
		t.Fatalf("list --json: code %d %+v\n%s", code, listed, out)
	}

	code, out, _ = idem(t, k, "", "dlq", "show", "--topic", topic, "--partition", "0", "--offset", "1")
	if code != 0 || !strings.Contains(out, "decode") || !strings.Contains(out, `"order": 1`) || !strings.Contains(out, "idempotency-key") {
		t.Fatalf("show --offset: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "show", "--topic", topic, "--key", "key-2", "--json")
	if code != 0 || !strings.Contains(out, `"order": 2`) {
		t.Fatalf("show --key --json: code %d\n%s", code, out)
	}

	// Dry run, then a filtered replay by fingerprint.
	code, out, _ = idem(t, k, "", "dlq", "replay", "--topic", topic, "--dry-run")
	if code != 0 || !strings.Contains(out, "would replay 4 of 4") {
		t.Fatalf("replay --dry-run: code %d\n%s", code, out)
	}
	decodeFP := listed.Groups[0].Fingerprint
	if listed.Groups[0].Kind != "decode" {
		decodeFP = listed.Groups[1].Fingerprint
	}
	code, out, _ = idem(t, k, "", "dlq", "replay", "--topic", topic, "--filter", "fingerprint="+decodeFP, "--rate", "100")
	if code != 0 || !strings.Contains(out, "replayed 2 of 4 pending records to source") || !strings.Contains(out, "2 records skipped") {
		t.Fatalf("replay --filter: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "replay", "--topic", topic)
	if code != 0 || !strings.Contains(out, "replayed 0 of 0") {
		t.Fatalf("second replay: code %d\n%s", code, out)
	}

	// Purge: refused without confirmation, done with "y" or --yes.
	seed(t, k, topic, origin, 2)
	code, out, errOut := idem(t, k, "n\n", "dlq", "purge", "--topic", topic)
	if code == 0 || !strings.Contains(out, "purge 2 pending records") || !strings.Contains(errOut, "not confirmed") {
		t.Fatalf("purge (declined): code %d\n%s%s", code, out, errOut)
	}
	code, out, _ = idem(t, k, "y\n", "dlq", "purge", "--topic", topic)
	if code != 0 || !strings.Contains(out, "purged 2") {
		t.Fatalf("purge (confirmed): code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "purge", "--topic", topic, "--yes")
	if code != 0 || !strings.Contains(out, "purged 0") {
		t.Fatalf("purge --yes: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "list", "--topic", topic)
	if code != 0 || !strings.Contains(out, "depth: 0 pending") {
		t.Fatalf("list after purge: code %d\n%s", code, out)
	}
}

func TestCLIBadInput(t *testing.T) {
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no topic", []string{"dlq", "list"}, `required flag(s) "topic" not set`},
		{"bad filter", []string{"dlq", "replay", "--topic", topic, "--filter", "kind=oops"}, "bad filter"},
		{"bad regexp", []string{"dlq", "replay", "--topic", topic, "--filter", "error~=("}, "bad filter"},
		{"unknown destination", []string{"dlq", "replay", "--topic", topic, "--to", testenv.Unique("nowhere")}, "unknown topic"},
		{"retry is not a destination", []string{"dlq", "replay", "--topic", topic, "--to", "retry"}, "name the retry tier"},
		{"empty destination", []string{"dlq", "replay", "--topic", topic, "--to", ""}, "--to is empty"},
		{"tier with source", []string{"dlq", "replay", "--topic", topic, "--tier", "2"}, "--tier"},
		{"negative tier", []string{"dlq", "replay", "--topic", topic, "--to", topic, "--tier", "-1"}, "--tier"},
		{"show needs a position", []string{"dlq", "show", "--topic", topic}, "--offset"},
		{"show offset and key", []string{"dlq", "show", "--topic", topic, "--offset", "1", "--key", "k"}, "not both"},
		{"show missing record", []string{"dlq", "show", "--topic", topic, "--offset", "5"}, "not found"},
		{"unknown topic", []string{"dlq", "list", "--topic", testenv.Unique("nope")}, "unknown topic"},
		{"unknown flag", []string{"dlq", "list", "--topic", topic, "--colour"}, "unknown flag"},
		{"unreachable broker", []string{"--brokers", "127.0.0.1:1", "dlq", "list", "--topic", topic}, "127.0.0.1:1"},
		{"bad kafka version", []string{"--kafka-version", "x", "dlq", "list", "--topic", topic}, "--kafka-version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := idem(t, k, "", tt.args...)
			if code != 1 {
				t.Fatalf("exit code %d, want 1", code)
			}
			if !strings.HasPrefix(errOut, "idem: ") || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tt.want) {
				t.Fatalf("stderr = %q, want one line mentioning %q", errOut, tt.want)
			}
		})
	}
}

// TestCLIReplayTo replays with no retry tiers at all: to a topic named
// explicitly (a custom tier name), never to a guessed default tier; an unknown
// --to topic is an error that leaves every record pending.
func TestCLIReplayTo(t *testing.T) {
	k := testenv.NewKafka(t)
	topic, origin := k.Topic(t, 1), k.Topic(t, 1)
	tier := testenv.Unique("custom_tier")
	k.CreateTopic(t, tier, 1)
	seed(t, k, topic, origin, 2)

	missing := testenv.Unique("no_such_tier")
	code, _, errOut := idem(t, k, "", "dlq", "replay", "--topic", topic, "--to", missing)
	if code != 1 || !strings.Contains(errOut, "unknown topic") || !strings.Contains(errOut, missing) {
		t.Fatalf("replay --to missing: code %d\n%s", code, errOut)
	}
	code, out, _ := idem(t, k, "", "dlq", "list", "--topic", topic)
	if code != 0 || !strings.Contains(out, "depth: 2 pending") {
		t.Fatalf("list after the refused replay: code %d\n%s", code, out)
	}

	code, out, _ = idem(t, k, "", "dlq", "replay", "--topic", topic, "--to", tier, "--tier", "3")
	if code != 0 || !strings.Contains(out, "replayed 2 of 2 pending records to "+tier) {
		t.Fatalf("replay --to %s: code %d\n%s", tier, code, out)
	}
	for off := range 2 {
		code, out, _ = idem(t, k, "", "dlq", "show", "--topic", tier, "--offset", fmt.Sprint(off), "--json")
		var shown struct {
			Key     string            `json:"key"`
			Failure map[string]string `json:"failure"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &shown) != nil {
			t.Fatalf("show %s offset %d: code %d\n%s", tier, off, code, out)
		}
		f := shown.Failure
		if shown.Key != fmt.Sprint("k", off) || f[retrytopic.HeaderTier] != "3" || f[retrytopic.HeaderOriginalTopic] != origin ||
			f[retrytopic.HeaderDueAt] == "" || f[retrytopic.HeaderErrorKind] == "" {
			t.Errorf("record %d in %s: %+v", off, tier, shown)
		}
	}
	code, _, errOut = idem(t, k, "", "dlq", "show", "--topic", origin, "--offset", "0")
	if code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("origin got a record: code %d %s", code, errOut)
	}
	topics, err := k.Admin(t).ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := topics[retrytopic.DefaultTierTopic(origin, "billing", 1)]; ok {
		t.Errorf("the default first tier of %s was created", origin)
	}
	if _, ok := topics[missing]; ok {
		t.Errorf("%s was created", missing)
	}
}

func TestSaramaConfigNeverCreatesTopics(t *testing.T) {
	a := &app{brokers: "127.0.0.1:9092", kafkaVersion: "4.0.0"}
	cfg, _, err := a.saramaConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Metadata.AllowAutoTopicCreation {
		t.Fatal("Metadata.AllowAutoTopicCreation is on")
	}
}
