package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testkit"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// idem runs the CLI in process and returns its exit code, stdout and stderr.
func idem(t *testing.T, k *idemtest.Kafka, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	getenv := func(name string) string {
		switch name {
		case "KAFKA_BROKERS":
			return strings.Join(k.Brokers, ",")
		case "DATABASE_URL":
			return "" // the offset model unless a test gives --database-url
		}
		return os.Getenv(name)
	}
	code := runEnv(args, getenv, strings.NewReader(stdin), &out, &errOut)
	t.Logf("idem %s -> %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// kitHeaders converts sarama's headers to idemtest's.
func kitHeaders(hs []sarama.RecordHeader) []handler.Header {
	out := make([]handler.Header, len(hs))
	for i, h := range hs {
		out[i] = handler.Header{Key: string(h.Key), Value: h.Value}
	}
	return out
}

// admin returns a cluster admin on k, closed when the test ends.
func admin(t *testing.T, k *idemtest.Kafka) sarama.ClusterAdmin {
	t.Helper()
	return testkit.Admin(t, k.Brokers, k.SaramaConfig())
}

// seed writes n dead-letter records for origin into topic: even ones fail
// with a timeout, odd ones with a decode error.
func seed(t *testing.T, k *idemtest.Kafka, topic, origin string, n int) {
	t.Helper()
	recs := make([]idemtest.Record, 0, n)
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
		hs := wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(fmt.Sprint("key-", i))}}, f)
		recs = append(recs, idemtest.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, `{"order":%d}`, i), Headers: kitHeaders(hs)})
	}
	k.Produce(t, topic, recs...)
}

func TestCLIEndToEnd(t *testing.T) {
	k := idemtest.Connect(t)
	topic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
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
			Fingerprint     string `json:"fingerprint"`
			Count           int64  `json:"count"`
			Kind            string `json:"kind"`
			SamplePartition int32  `json:"sample_partition"`
			SampleOffset    int64  `json:"sample_offset"`
		} `json:"groups"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || listed.Depth != 4 || len(listed.Groups) != 2 || listed.Groups[0].Count != 2 {
		t.Fatalf("list --json: code %d %+v\n%s", code, listed, out)
	}
	// list shows each group's sample as PARTITION/OFFSET, which show takes.
	_, table, _ := idem(t, k, "", "dlq", "list", "--topic", topic)
	for _, g := range listed.Groups {
		if at := fmt.Sprintf("%d/%d", g.SamplePartition, g.SampleOffset); !strings.Contains(table, "SAMPLE AT") || !strings.Contains(table, " "+at+" ") {
			t.Errorf("list does not show the %s group's sample at %s:\n%s", g.Kind, at, table)
		}
		code, out, _ := idem(t, k, "", "dlq", "show", "--topic", topic, "--partition", fmt.Sprint(g.SamplePartition), "--offset", fmt.Sprint(g.SampleOffset))
		if code != 0 || !strings.Contains(out, g.Kind) {
			t.Errorf("show at the %s group's sample %d/%d: code %d\n%s", g.Kind, g.SamplePartition, g.SampleOffset, code, out)
		}
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
	// Without a database a filtered replay would drop the rest from
	// pending: --dry-run warns, a real run refuses without the flag.
	code, out, _ = idem(t, k, "", "dlq", "replay", "--topic", topic, "--filter", "fingerprint="+decodeFP, "--dry-run")
	if code != 0 || !strings.Contains(out, "would replay 2 of 4") || !strings.Contains(out, "NO LONGER BE PENDING") {
		t.Fatalf("replay --filter --dry-run: code %d\n%s", code, out)
	}
	code, _, errOut := idem(t, k, "", "dlq", "replay", "--topic", topic, "--filter", "fingerprint="+decodeFP)
	if code != 1 || !strings.Contains(errOut, "refused: 2 of 4") || !strings.Contains(errOut, "--drop-unmatched-from-pending") {
		t.Fatalf("replay --filter without the flag: code %d\n%s", code, errOut)
	}
	// A filter matching nothing exits 1 and leaves everything pending.
	code, _, errOut = idem(t, k, "", "dlq", "replay", "--topic", topic, "--filter", "key=rf-4", "--drop-unmatched-from-pending")
	if code != 1 || !strings.Contains(errOut, "no pending record") {
		t.Fatalf("replay matching nothing: code %d\n%s", code, errOut)
	}
	code, out, _ = idem(t, k, "", "dlq", "replay", "--topic", topic, "--filter", "fingerprint="+decodeFP, "--rate", "100", "--drop-unmatched-from-pending")
	if code != 0 || !strings.Contains(out, "replayed 2 of 4 pending records to source") || !strings.Contains(out, "2 records skipped") {
		t.Fatalf("replay --filter: code %d\n%s", code, out)
	}
	code, _, errOut = idem(t, k, "", "dlq", "replay", "--topic", topic)
	if code != 1 || !strings.Contains(errOut, "nothing pending") {
		t.Fatalf("second replay: code %d\n%s", code, errOut)
	}

	// Purge: refused without confirmation, done with "y" or --yes.
	seed(t, k, topic, origin, 2)
	code, out, errOut = idem(t, k, "n\n", "dlq", "purge", "--topic", topic)
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
	k := idemtest.Connect(t)
	topic := k.Topic(t, "dlq", 1)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no topic", []string{"dlq", "list"}, "give --topic, or --source and --group"},
		{"bad filter", []string{"dlq", "replay", "--topic", topic, "--filter", "kind=oops"}, "bad filter"},
		{"bad regexp", []string{"dlq", "replay", "--topic", topic, "--filter", "error~=("}, "bad filter"},
		{"unknown destination", []string{"dlq", "replay", "--topic", topic, "--to", topic + ".nowhere"}, "unknown topic"},
		{"retry is not a destination", []string{"dlq", "replay", "--topic", topic, "--to", "retry"}, "name the retry tier"},
		{"empty destination", []string{"dlq", "replay", "--topic", topic, "--to", ""}, "--to is empty"},
		{"tier with source", []string{"dlq", "replay", "--topic", topic, "--tier", "2"}, "--tier"},
		{"negative tier", []string{"dlq", "replay", "--topic", topic, "--to", topic, "--tier", "-1"}, "--tier"},
		{"show needs a position", []string{"dlq", "show", "--topic", topic}, "--offset"},
		{"show offset and key", []string{"dlq", "show", "--topic", topic, "--offset", "1", "--key", "k"}, "not both"},
		{"show missing record", []string{"dlq", "show", "--topic", topic, "--offset", "5"}, "not found"},
		{"unknown topic", []string{"dlq", "list", "--topic", topic + ".nope"}, "unknown topic"},
		{"unknown flag", []string{"dlq", "list", "--topic", topic, "--colour"}, "unknown flag"},
		{"unreachable broker", []string{"dlq", "list", "--topic", topic, "--brokers", "127.0.0.1:1"}, "127.0.0.1:1"},
		{"bad kafka version", []string{"dlq", "list", "--topic", topic, "--kafka-version", "x"}, "--kafka-version"},
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
	k := idemtest.Connect(t)
	topic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
	tier := origin + ".custom_tier" // deleted with origin
	k.CreateTopic(t, tier, 1)
	seed(t, k, topic, origin, 2)

	missing := origin + ".no_such_tier"
	code, _, errOut := idem(t, k, "", "dlq", "replay", "--topic", topic, "--to", missing)
	if code != 1 || !strings.Contains(errOut, "unknown topic") || !strings.Contains(errOut, missing) {
		t.Fatalf("replay --to missing: code %d\n%s", code, errOut)
	}
	code, out, _ := idem(t, k, "", "dlq", "list", "--topic", topic)
	if code != 0 || !strings.Contains(out, "depth: 2 pending") {
		t.Fatalf("list after the refused replay: code %d\n%s", code, out)
	}

	// A custom tier name is no replay target unless listed.
	if code, _, errOut := idem(t, k, "", "dlq", "replay", "--topic", topic, "--to", tier, "--tier", "3"); code != 1 || !strings.Contains(errOut, "--replay-topic") {
		t.Fatalf("replay --to %s, not listed: code %d\n%s", tier, code, errOut)
	}
	code, out, _ = idem(t, k, "", "dlq", "replay", "--topic", topic, "--to", tier, "--tier", "3", "--replay-topic", tier)
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
		if shown.Key != fmt.Sprint("k", off) || f[wire.HeaderTier] != "3" || f[wire.HeaderOriginalTopic] != origin ||
			f[wire.HeaderDueAt] == "" || f[wire.HeaderErrorKind] == "" {
			t.Errorf("record %d in %s: %+v", off, tier, shown)
		}
	}
	code, _, errOut = idem(t, k, "", "dlq", "show", "--topic", origin, "--offset", "0")
	if code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("origin got a record: code %d %s", code, errOut)
	}
	topics, err := admin(t, k).ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := topics[retrytopic.Policy{}.Tier(origin, "billing", 1)]; ok {
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

// terminalSafe fails when out would send anything but printable text to a
// terminal: invalid UTF-8, control characters (other than newline and tab),
// DEL, C1 controls, bidi overrides.
func terminalSafe(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s: output is not valid UTF-8", what)
	}
	for i, r := range out {
		if r != '\n' && r != '\t' && !strconv.IsPrint(r) {
			t.Errorf("%s: raw %U at byte %d: %q", what, r, i, out[max(0, i-20):min(len(out), i+20)])
			return
		}
	}
}

// TestCLIShowListUnsafeBytes: keys, headers, idem-* values and payloads with
// NULs, escape sequences, invalid UTF-8 and bidi characters are printed
// escaped by show and list (text and JSON), and JSON keeps the bytes.
func TestCLIShowListUnsafeBytes(t *testing.T) {
	k := idemtest.Connect(t)
	topic := k.Topic(t, "dlq", 1)
	key := "k\x00\xff\x1b[31m"
	badError := "boom \x1b[2J\xff\x00"
	values := []string{
		"{\"note\":\"\u202e\u009b\x7f\"}", // JSON, valid UTF-8, with bidi, C1 and DEL inside a string
		"\xff\x1b[2J\x00",                 // not UTF-8: hex dump
		"line\x1b[31m red\r\nnext",        // text with controls
	}
	for _, v := range values {
		f := retrytopic.Failure{OriginalTopic: "orig", Group: "billing", Kind: "permanent\x1b", ErrorType: "*x\x1b[0m",
			Error: "replaced below", Stack: []byte("goroutine 1\n\tmain.go:1 \x1b[2J\n")}
		hs := wire.Encode([]sarama.RecordHeader{
			{Key: []byte("idempotency-key"), Value: []byte("idem\x00\xff")},
			{Key: []byte("h\x1b]0;evil\x07"), Value: []byte("\x00\x9b")},
		}, f)
		hs = append(hs, sarama.RecordHeader{Key: []byte(wire.HeaderError), Value: []byte(badError)}) // last one wins
		k.Produce(t, topic, idemtest.Record{Key: []byte(key), Value: []byte(v), Headers: kitHeaders(hs)})
	}

	code, out, _ := idem(t, k, "", "dlq", "show", "--topic", topic, "--offset", "0")
	terminalSafe(t, "show", out)
	for _, want := range []string{strconv.Quote(key), `\x1b[2J\xff\x00`, `"h\x1b]0;evil\a": "\x00\x9b"`, `"*x\x1b[0m"`,
		`"\tmain.go:1 \x1b[2J"`, `\u202e\u009b\x7f`} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("show: code %d, output lacks %s", code, want)
		}
	}
	code, out, _ = idem(t, k, "", "dlq", "show", "--topic", topic, "--offset", "1")
	terminalSafe(t, "show (binary value)", out)
	if code != 0 || !strings.Contains(out, "ff 1b 5b 32 4a 00") {
		t.Errorf("show: binary value not hex-dumped")
	}
	code, out, _ = idem(t, k, "", "dlq", "show", "--topic", topic, "--offset", "2")
	terminalSafe(t, "show (text value)", out)
	if code != 0 || !strings.Contains(out, `"line\x1b[31m red\r"`) || !strings.Contains(out, "\n  next\n") {
		t.Errorf("show: text value lines not escaped one by one")
	}

	for off, v := range values {
		code, out, _ = idem(t, k, "", "dlq", "show", "--topic", topic, "--offset", fmt.Sprint(off), "--json")
		terminalSafe(t, "show --json", out)
		var shown struct {
			Key     map[string]string `json:"key"`
			Headers []struct {
				Key   any `json:"key"`
				Value any `json:"value"`
			} `json:"headers"`
			Failure map[string]any  `json:"failure"`
			Value   json.RawMessage `json:"value"`
		}
		if err := json.Unmarshal([]byte(out), &shown); code != 0 || err != nil {
			t.Fatalf("show --json: code %d, %v", code, err)
		}
		if shown.Key["hex"] != hex.EncodeToString([]byte(key)) || len(shown.Headers) != 2 || shown.Headers[1].Key != "h\x1b]0;evil\x07" ||
			fmt.Sprint(shown.Headers[0].Value) != fmt.Sprint(map[string]any{"hex": hex.EncodeToString([]byte("idem\x00\xff"))}) ||
			fmt.Sprint(shown.Failure[wire.HeaderError]) != fmt.Sprint(map[string]any{"hex": hex.EncodeToString([]byte(badError))}) {
			t.Errorf("show --json record %d does not keep the bytes: %+v", off, shown)
		}
		var back any
		switch off {
		case 0:
			var got, want any
			if json.Unmarshal(shown.Value, &got) != nil || json.Unmarshal([]byte(v), &want) != nil || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("JSON value %s, want %q", shown.Value, v)
			}
		case 1:
			if json.Unmarshal(shown.Value, &back) != nil || fmt.Sprint(back) != fmt.Sprint(map[string]any{"hex": hex.EncodeToString([]byte(v))}) {
				t.Errorf("binary value %s", shown.Value)
			}
		case 2:
			if json.Unmarshal(shown.Value, &back) != nil || back != v {
				t.Errorf("text value %s, want %q", shown.Value, v)
			}
		}
	}

	code, out, _ = idem(t, k, "", "dlq", "list", "--topic", topic)
	terminalSafe(t, "list", out)
	if code != 0 || !strings.Contains(out, `"permanent\x1b"`) || !strings.Contains(out, `"*x\x1b[0m"`) || !strings.Contains(out, `\x1b[2J\xff\x00`) {
		t.Errorf("list: code %d, fields not escaped", code)
	}
	code, out, _ = idem(t, k, "", "dlq", "list", "--topic", topic, "--json")
	terminalSafe(t, "list --json", out)
	var listed struct {
		Groups []struct {
			Kind  string `json:"kind"`
			Count int    `json:"count"`
		} `json:"groups"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Groups) != 1 || listed.Groups[0].Kind != "permanent\x1b" || listed.Groups[0].Count != 3 {
		t.Errorf("list --json: code %d %+v", code, listed)
	}
}
