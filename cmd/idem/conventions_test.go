package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/retrytopic"
)

// noBroker is an environment without Kafka or database settings.
var noBroker = map[string]string{}

// TestEveryCommandHasExamples walks the command tree: each command's help
// shows an Examples section.
func TestEveryCommandHasExamples(t *testing.T) {
	t.Parallel()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%s has no Example", c.CommandPath())
		}
		args := append(strings.Fields(c.CommandPath())[1:], "--help")
		code, out, _ := idemEnv(t, noBroker, args...)
		if code != 0 || !strings.Contains(out, "Examples:\n  ") {
			t.Errorf("idem %s: code %d, no Examples section", strings.Join(args, " "), code)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd(&app{getenv: func(string) string { return "" }}))
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, _ := idemEnv(t, noBroker, "--version")
	if code != 0 || !strings.HasPrefix(out, "idem ") || !strings.Contains(out, runtime.Version()) {
		t.Fatalf("--version: code %d %q", code, out)
	}
}

// TestUnknownCommands: a mistyped command exits 1 with one line naming it
// and the nearest command, never "unknown flag" and never help with exit 0.
func TestUnknownCommands(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"top level", []string{"dql"}, []string{`unknown command "dql" for "idem"`, `did you mean "dlq"?`}},
		{"dlq subcommand with its flags", []string{"dlq", "dept", "--topic", "x", "--json"}, []string{`unknown command "dept" for "idem dlq"`, `did you mean "depth"?`}},
		{"ordering subcommand", []string{"ordering", "relase", "--all"}, []string{`unknown command "relase"`, `did you mean "release"?`}},
		{"nothing near", []string{"frobnicate"}, []string{`unknown command "frobnicate" for "idem"`, "idem --help"}},
		{"flags without a command", []string{"dlq", "--topic", "x"}, []string{"idem dlq needs a command", "depth", "list"}},
		{"flag before the command", []string{"--tls", "dlq", "list"}, []string{"give flags after the command name: idem dlq … --tls"}},
		{"flag before the subcommand", []string{"dlq", "--json", "depth", "-t", "x"}, []string{"give flags after the command name: idem dlq depth … --json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := idemEnv(t, noBroker, tt.args...)
			if code != 1 || out != "" || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, "unknown flag") {
				t.Fatalf("code %d, stdout %q, stderr %q: want exit 1 and one line on stderr", code, out, errOut)
			}
			for _, w := range tt.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr %q lacks %q", errOut, w)
				}
			}
		})
	}
	// A group without a command prints its help and succeeds.
	if code, out, _ := idemEnv(t, noBroker, "dlq"); code != 0 || !strings.Contains(out, "Available Commands:") {
		t.Errorf("idem dlq: code %d\n%s", code, out)
	}
}

// TestHelpListsWhatExists: dlq's help lists exactly its subcommands (depth
// included), and commands list only the flags they use.
func TestHelpListsWhatExists(t *testing.T) {
	t.Parallel()
	code, out, _ := idemEnv(t, noBroker, "dlq", "--help")
	if code != 0 {
		t.Fatalf("dlq --help: code %d", code)
	}
	avail := out[strings.Index(out, "Available Commands:"):]
	avail = avail[:strings.Index(avail, "\n\n")]
	var listed []string
	for _, l := range strings.Split(avail, "\n")[1:] {
		listed = append(listed, strings.Fields(l)[0])
	}
	if got := strings.Join(listed, " "); got != "archive depth jobs list purge replay resolve show" {
		t.Errorf("dlq --help lists %q", got)
	}
	for _, name := range listed {
		if code, _, _ := idemEnv(t, noBroker, "dlq", name, "--help"); code != 0 {
			t.Errorf("dlq %s --help: code %d", name, code)
		}
	}
	kafkaFlags := []string{"--brokers", "--kafka-version", "--tls", "--tls-ca", "--tls-cert", "--tls-key", "--sasl-mechanism", "--sasl-user"}
	for _, tt := range []struct {
		args  []string
		kafka bool
	}{
		{[]string{"migrate", "--help"}, false},
		{[]string{"ordering", "list", "--help"}, false},
		{[]string{"--help"}, false},
		{[]string{"ordering", "release", "--help"}, true},
		{[]string{"dlq", "list", "--help"}, true},
		{[]string{"dlq", "depth", "--help"}, true},
	} {
		_, out, _ := idemEnv(t, noBroker, tt.args...)
		out = out[strings.Index(out, "\nFlags:"):]
		for _, f := range kafkaFlags {
			if has := strings.Contains(out, f+" "); has != tt.kafka {
				t.Errorf("idem %s: lists %s: %v, want %v", strings.Join(tt.args, " "), f, has, tt.kafka)
			}
		}
		if tt.kafka && !strings.Contains(out, "-b, --brokers") {
			t.Errorf("idem %s: no -b", strings.Join(tt.args, " "))
		}
	}
	if code, _, errOut := idemEnv(t, noBroker, "migrate", "--brokers", "x"); code != 1 || !strings.Contains(errOut, "unknown flag: --brokers") {
		t.Errorf("migrate --brokers: code %d %q", code, errOut)
	}
}

// TestConnectionSettings: flags and their environment variables reach the
// client config, flags win, and bad settings fail before any connection.
func TestConnectionSettings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"brokers from KAFKA_BROKERS", map[string]string{"KAFKA_BROKERS": "127.0.0.1:1"}, nil, "127.0.0.1:1"},
		{"-b wins over KAFKA_BROKERS", map[string]string{"KAFKA_BROKERS": "127.0.0.1:1"}, []string{"-b", "127.0.0.1:2"}, "127.0.0.1:2"},
		{"bad IDEM_TLS", map[string]string{"IDEM_TLS": "maybe"}, nil, `IDEM_TLS="maybe"`},
		{"version from IDEM_KAFKA_VERSION", map[string]string{"IDEM_KAFKA_VERSION": "zz"}, nil, `--kafka-version "zz"`},
		{"unknown mechanism", map[string]string{"IDEM_SASL_PASSWORD": "p"}, []string{"--sasl-mechanism", "GSSAPI", "--sasl-user", "u"}, "SCRAM-SHA-512"},
		{"mechanism without user", map[string]string{"IDEM_SASL_PASSWORD": "p", "IDEM_SASL_MECHANISM": "PLAIN"}, nil, "needs a user"},
		{"no password", nil, []string{"--sasl-mechanism", "PLAIN", "--sasl-user", "u"}, "IDEM_SASL_PASSWORD"},
		{"user without mechanism", map[string]string{"IDEM_SASL_USER": "u"}, nil, "no SASL mechanism"},
		{"certificate without key", nil, []string{"--tls-cert", "c.pem"}, "KeyFile"},
		{"missing CA file", map[string]string{"IDEM_TLS_CA": "/nonexistent/ca.pem"}, nil, "/nonexistent/ca.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"dlq", "depth", "-t", "x"}, tt.args...)
			if _, ok := tt.env["KAFKA_BROKERS"]; !ok && !strings.Contains(strings.Join(tt.args, " "), "-b ") {
				args = append(args, "-b", "127.0.0.1:1")
			}
			code, out, errOut := idemEnv(t, tt.env, args...)
			if code != 1 || out != "" || !strings.Contains(errOut, tt.want) {
				t.Fatalf("code %d, stderr %q: want exit 1 mentioning %q", code, errOut, tt.want)
			}
		})
	}
}

// TestDLQDepthAndSourceGroup: depth per partition and in total, as text and
// JSON, against the real broker; --source/--group name <topic>.<group>.dlq
// for every dlq command.
func TestDLQDepthAndSourceGroup(t *testing.T) {
	t.Parallel()
	k := idemtest.Connect(t)
	source, group := k.Topic(t, "orders", 3), k.Group(t, "billing")
	dlqTopic := retrytopic.Policy{}.DLQ(source, group) // deleted with source
	k.CreateTopic(t, dlqTopic, 3)
	seed(t, k, dlqTopic, source, 3) // partition 0
	byName := []string{"--source", source, "--group", group}

	code, out, _ := idem(t, k, "", append([]string{"dlq", "depth"}, byName...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")[1:] // after the view line
	if code != 0 || len(lines) != 5 || strings.Join(strings.Fields(lines[0]), " ") != "PARTITION START END PENDING" ||
		strings.Join(strings.Fields(lines[1]), " ") != "0 0 3 3" || strings.Join(strings.Fields(lines[3]), " ") != "2 0 0 0" ||
		lines[4] != fmt.Sprintf("total: 3 pending in %s (admin group %s.admin)", dlqTopic, dlqTopic) {
		t.Fatalf("depth: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", append([]string{"dlq", "list"}, byName...)...)
	if code != 0 || !strings.Contains(out, "depth: 3 pending in "+dlqTopic) {
		t.Fatalf("list --source --group: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", append([]string{"dlq", "show", "--offset", "2"}, byName...)...)
	if code != 0 || !strings.Contains(out, `"order": 2`) {
		t.Fatalf("show --source --group: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", append([]string{"dlq", "replay", "--filter", "kind=decode", "--drop-unmatched-from-pending"}, byName...)...)
	if code != 0 || !strings.Contains(out, "replayed 1 of 3 pending records to source") {
		t.Fatalf("replay --source --group: code %d\n%s", code, out)
	}
	seed(t, k, dlqTopic, source, 2)
	code, out, _ = idem(t, k, "", "dlq", "depth", "-t", dlqTopic, "--json")
	var depth struct {
		Topic      string `json:"topic"`
		AdminGroup string `json:"admin_group"`
		Partitions []struct {
			Partition int32 `json:"partition"`
			Start     int64 `json:"start"`
			End       int64 `json:"end"`
			Committed int64 `json:"committed"`
			Pending   int64 `json:"pending"`
		} `json:"partitions"`
		Total int64 `json:"total"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &depth) != nil || depth.Topic != dlqTopic || depth.Total != 2 || len(depth.Partitions) != 3 ||
		depth.Partitions[0].Start != 3 || depth.Partitions[0].End != 5 || depth.Partitions[0].Committed != 3 || depth.Partitions[1].Committed != -1 ||
		depth.Partitions[0].Pending != 2 {
		t.Fatalf("depth --json: code %d %+v\n%s", code, depth, out)
	}
	code, out, _ = idem(t, k, "", append([]string{"dlq", "purge", "--yes"}, byName...)...)
	if code != 0 || !strings.Contains(out, "purged 2 pending records of "+dlqTopic) {
		t.Fatalf("purge --source --group: code %d\n%s", code, out)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--source", source}, "--source and --group go together"},
		{[]string{"--group", group}, "--source and --group go together"},
		{[]string{"--topic", dlqTopic, "--source", source, "--group", group}, "not both"},
		{[]string{"--source", source, "--group", "nogroup"}, "unknown topic"},
	} {
		code, _, errOut := idem(t, k, "", append([]string{"dlq", "depth"}, tt.args...)...)
		if code != 1 || !strings.Contains(errOut, tt.want) {
			t.Errorf("dlq depth %v: code %d %q, want %q", tt.args, code, errOut, tt.want)
		}
	}
}

// TestCLIDocListsEveryCommand: the command table of docs/cli.md lists every
// command idem help lists (and no other), so the guide cannot lose one.
func TestCLIDocListsEveryCommand(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `idem ([a-z -]+?)`")
	documented := map[string]bool{}
	for _, l := range strings.Split(string(doc), "\n") {
		if m := row.FindStringSubmatch(l); m != nil {
			documented[m[1]] = true
		}
	}
	commands := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			if sub.HasAvailableSubCommands() {
				walk(sub)
				continue
			}
			commands[strings.TrimPrefix(sub.CommandPath(), "idem ")] = true
		}
	}
	walk(newRootCmd(&app{}))
	for c := range commands {
		if !documented[c] {
			t.Errorf("idem %s is missing from the command table of docs/cli.md", c)
		}
	}
	for c := range documented {
		if !commands[c] {
			t.Errorf("docs/cli.md's command table lists idem %s, which idem help does not", c)
		}
	}
	if len(commands) < 15 {
		t.Fatalf("found %d commands: is the walk still finding them?", len(commands))
	}
}
