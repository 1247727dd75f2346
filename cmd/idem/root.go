package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/kafkaauth"
	"github.com/idemhq/idem/serde"
)

// defaultBrokers is --brokers' default when KAFKA_BROKERS is not set.
const defaultBrokers = "127.0.0.1:9092"

// passwordEnv holds the SASL password; there is no flag for it, so it never
// shows in a process list or a shell history.
const passwordEnv = "IDEM_SASL_PASSWORD"

// envAnnotation marks a flag whose value may come from an environment
// variable (the annotation's value) when the flag is not given.
const envAnnotation = "idem-env"

// app holds the flags and the I/O of one invocation.
type app struct {
	brokers      string
	kafkaVersion string
	// dlqDB is the dlq commands' --database-url (the failure index), actor
	// their --actor, fromTopic their --from-topic.
	dlqDB, actor string
	fromTopic    bool
	auth         kafkaauth.Options
	// args are the invocation's arguments, getenv its environment.
	args        []string
	getenv      func(string) string
	in          io.Reader
	out, errOut io.Writer

	// mask is the dlq commands' --mask; keyFile their, idem console's and
	// idem keys' --encryption-key-file.
	mask    []string
	keyFile string
	// registryURL is the dlq commands' --registry-url; reg its client,
	// made once (registry).
	registryURL string
	reg         *serde.Registry
}

// run executes the CLI with args and returns the exit code: 0 on success, 1
// on any error (printed as one line on errOut).
func run(args []string, in io.Reader, out, errOut io.Writer) int {
	return runEnv(args, os.Getenv, in, out, errOut)
}

// runEnv is run with the environment read through getenv.
func runEnv(args []string, getenv func(string) string, in io.Reader, out, errOut io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	a := &app{args: args, getenv: getenv, in: in, out: out, errOut: errOut}
	root := newRootCmd(a)
	root.SetArgs(args)
	root.SetIn(in)
	root.SetOut(out)
	root.SetErr(errOut)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(errOut, "idem: "+oneLine(err.Error()))
		return 1
	}
	return 0
}

// oneLine folds a multi-line error onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// versionString is the module version from the build info (set by
// `go install …@version`; "(devel)" for a build from a checkout), with the
// VCS revision when the build recorded it, and the Go version.
func versionString() string {
	v := "(unknown)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " (" + s.Value[:12] + ")"
			}
		}
	}
	return v + " " + runtime.Version()
}

// newRootCmd builds the command tree. Each command group is added by one
// line here; every command that only holds subcommands then gets the
// unknown-command handling of group. A command that talks to Kafka calls
// a.kafkaFlags on itself and a.saramaConfig in its RunE.
func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "idem <command>",
		Short: "Operate idem consumers: dead-letter topics, parked ordered messages, live controls, schema migrations",
		Long: `idem operates the consumers built with github.com/idemhq/idem: inspect, replay
and purge dead-letter topics, release messages parked by ordering-by-key,
pause partitions and re-drive windows of a consumer group (the live
controls: pause, resume, redrive, fleet), and create idem's PostgreSQL
tables. For a first trial, idem topic create makes a
topic and idem produce writes records to it from stdin.

Commands that talk to Kafka take --brokers (-b) and, for a secured cluster,
--tls* and --sasl-* flags; each flag can also be set by the environment
variable named in its help (KAFKA_BROKERS, IDEM_TLS, IDEM_SASL_USER, …). The
SASL password is read only from IDEM_SASL_PASSWORD, an OAUTHBEARER client
secret only from IDEM_SASL_OAUTH_CLIENT_SECRET. Flags go after the command
name (idem dlq list --tls …). Errors print one line on stderr and exit 1.`,
		Example: `  idem dlq list -b kafka-1:9092 --source payments --group billing
  idem dlq depth --topic payments.billing.dlq --json
  IDEM_SASL_PASSWORD=… idem dlq list -b kafka:9093 --tls-ca ca.pem --sasl-mechanism SCRAM-SHA-512 --sasl-user ops -t payments.billing.dlq
  idem migrate --database-url postgres://idem@db/idem
  idem topic create payments --partitions 6 && printf 'pay-1:{"amount":10}\n' | idem produce payments --key-sep : --key-header idempotency-key`,
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.applyEnv(cmd.Flags())
		},
	}
	root.SetVersionTemplate("idem {{.Version}}\n")
	root.AddCommand(newDLQCmd(a))
	root.AddCommand(newMigrateCmd(a))
	root.AddCommand(newOrderingCmd(a))
	root.AddCommand(newCheckpointCmd(a))
	root.AddCommand(newOutboxCmd(a))
	root.AddCommand(newScheduleCmd(a))
	root.AddCommand(newConsoleCmd(a))
	root.AddCommand(newKeysCmd(a))
	root.AddCommand(newTopicCmd(a))
	root.AddCommand(newProduceCmd(a))
	root.AddCommand(newPauseCmd(a), newResumeCmd(a), newRedriveCmd(a), newFleetCmd(a))
	cobraCommands(root)
	a.groups(root)
	return root
}

// cobraCommands adds cobra's help and completion commands now rather than at
// Execute, to give them examples (and, through groups, the unknown-command
// behaviour of the others).
func cobraCommands(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Example = "  idem help dlq replay"
		case "completion":
			c.Example = "  source <(idem completion bash)\n  idem completion zsh > \"${fpath[1]}/_idem\""
			for _, sh := range c.Commands() {
				sh.Example = "  idem completion " + sh.Name() + " > idem-completion." + sh.Name()
			}
		}
	}
}

// groups applies group to c and to every command below it that only holds
// subcommands (has no Run of its own).
func (a *app) groups(c *cobra.Command) {
	if c.HasSubCommands() && !c.Runnable() {
		a.group(c)
	}
	for _, sub := range c.Commands() {
		a.groups(sub)
	}
}

// group makes c a command that only holds subcommands: without arguments or
// flags it prints its help; with an unknown subcommand it fails, suggesting
// the nearest one (kubectl's habit), instead of reporting a flag of the
// intended subcommand as unknown.
func (a *app) group(c *cobra.Command) {
	c.Args = cobra.ArbitraryArgs
	c.FParseErrWhitelist.UnknownFlags = true
	c.SuggestionsMinimumDistance = 2
	c.RunE = func(cmd *cobra.Command, args []string) error {
		for i, arg := range a.args {
			if i > 0 && strings.HasPrefix(a.args[i-1], "-") && !strings.Contains(a.args[i-1], "=") && isSubcommand(cmd, arg) {
				// A flag this command does not know took the command name as
				// its value: "idem --tls dlq list" reads dlq as --tls's value.
				return fmt.Errorf("give flags after the command name: %s %s … %s, not %s %s %s …",
					cmd.CommandPath(), arg, a.args[i-1], cmd.CommandPath(), a.args[i-1], arg)
			}
		}
		if len(args) > 0 {
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += fmt.Sprintf("; did you mean %q?", s[0])
			}
			return fmt.Errorf("%s (see '%s --help')", msg, cmd.CommandPath())
		}
		for _, arg := range a.args {
			if strings.HasPrefix(arg, "-") {
				var names []string
				for _, sub := range cmd.Commands() {
					if sub.IsAvailableCommand() && sub.Name() != "help" {
						names = append(names, sub.Name())
					}
				}
				return fmt.Errorf("%s needs a command: %s (see '%s --help')", cmd.CommandPath(), strings.Join(names, ", "), cmd.CommandPath())
			}
		}
		return cmd.Help()
	}
}

// isSubcommand reports whether name is a command of c.
func isSubcommand(c *cobra.Command, name string) bool {
	for _, sub := range c.Commands() {
		if sub.Name() == name {
			return true
		}
	}
	return false
}

// envFlag lets flag name of fs be set by the environment variable env when
// it is not given, and says so in its help.
func envFlag(fs *pflag.FlagSet, name, env string) {
	f := fs.Lookup(name)
	f.Usage += " (env " + env + ")"
	_ = fs.SetAnnotation(name, envAnnotation, []string{env})
}

// env returns the environment variable name: through a.getenv, or
// os.Getenv when that is nil.
func (a *app) env(name string) string {
	if a.getenv == nil {
		return os.Getenv(name)
	}
	return a.getenv(name)
}

// applyEnv sets every flag of fs that was not given from its environment
// variable, when that is set.
func (a *app) applyEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		env := f.Annotations[envAnnotation]
		if err != nil || f.Changed || len(env) == 0 {
			return
		}
		if v := a.env(env[0]); v != "" {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q (for --%s): %v", env[0], v, f.Name, e)
			}
		}
	})
	return err
}

// kafkaFlags adds the Kafka connection flags to c (and its subcommands):
// --brokers/-b, --kafka-version, and the TLS and SASL flags of a secured
// cluster, each also settable by an environment variable. Every command that
// talks to Kafka calls it; saramaConfig turns the flags into a client config.
func (a *app) kafkaFlags(c *cobra.Command) {
	f := c.PersistentFlags()
	f.StringVarP(&a.brokers, "brokers", "b", defaultBrokers, "comma-separated Kafka bootstrap brokers")
	envFlag(f, "brokers", "KAFKA_BROKERS")
	f.StringVar(&a.kafkaVersion, "kafka-version", "4.0.0", "Kafka protocol version to speak (a 3.x cluster: its version)")
	envFlag(f, "kafka-version", "IDEM_KAFKA_VERSION")
	f.BoolVar(&a.auth.TLS, "tls", false, "connect with TLS, verifying brokers against the system roots or --tls-ca")
	envFlag(f, "tls", "IDEM_TLS")
	f.StringVar(&a.auth.CAFile, "tls-ca", "", "PEM file of the CA certificates of the brokers (implies --tls)")
	envFlag(f, "tls-ca", "IDEM_TLS_CA")
	f.StringVar(&a.auth.CertFile, "tls-cert", "", "PEM client certificate, for brokers that require one (implies --tls; needs --tls-key)")
	envFlag(f, "tls-cert", "IDEM_TLS_CERT")
	f.StringVar(&a.auth.KeyFile, "tls-key", "", "PEM private key of --tls-cert")
	envFlag(f, "tls-key", "IDEM_TLS_KEY")
	f.BoolVar(&a.auth.InsecureSkipVerify, "tls-insecure-skip-verify", false, "accept any broker certificate (implies --tls; INSECURE, for tests only)")
	envFlag(f, "tls-insecure-skip-verify", "IDEM_TLS_INSECURE_SKIP_VERIFY")
	f.StringVar(&a.auth.Mechanism, "sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (the password is read from "+passwordEnv+"), or OAUTHBEARER (--sasl-oauth-*)")
	envFlag(f, "sasl-mechanism", "IDEM_SASL_MECHANISM")
	f.StringVar(&a.auth.User, "sasl-user", "", "SASL user name")
	envFlag(f, "sasl-user", "IDEM_SASL_USER")
	a.oauthFlags(f)
}

// saramaConfig returns the client config the Kafka flags ask for.
func (a *app) saramaConfig() (*sarama.Config, []string, error) {
	v, err := sarama.ParseKafkaVersion(a.kafkaVersion)
	if err != nil {
		return nil, nil, fmt.Errorf("--kafka-version %q: %v", a.kafkaVersion, err)
	}
	var brokers []string
	for _, b := range strings.Split(a.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) == 0 {
		return nil, nil, errors.New("--brokers is empty")
	}
	cfg := sarama.NewConfig()
	cfg.Version = v
	cfg.ClientID = "idem-cli"
	cfg.Net.DialTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = 1
	cfg.Metadata.Full = false
	// No command may create a topic by naming it (a typo in --topic or --to,
	// or a deleted original topic), whatever the broker allows.
	cfg.Metadata.AllowAutoTopicCreation = false
	auth := a.auth
	switch {
	case isOAuthBearer(auth.Mechanism):
		if err := a.oauthSecrets(&auth); err != nil {
			return nil, nil, err
		}
	case auth.Mechanism != "":
		if auth.Password = a.env(passwordEnv); auth.Password == "" {
			return nil, nil, fmt.Errorf("--sasl-mechanism %s needs a password: set %s", auth.Mechanism, passwordEnv)
		}
	}
	if err := kafkaauth.Apply(cfg, auth); err != nil {
		return nil, nil, fmt.Errorf("%w (see the --tls and --sasl flags)", err)
	}
	if auth.InsecureSkipVerify {
		fmt.Fprintln(a.errOut, "idem: warning: --tls-insecure-skip-verify: broker certificates are not verified; anyone on the path can read and change the traffic")
	}
	return cfg, brokers, nil
}

// openDLQ connects a dlq.Client and returns it with the dead-letter topic t
// names.
func (a *app) openDLQ(t dlqTopic) (*dlq.Client, string, error) {
	topic, err := t.name()
	if err != nil {
		return nil, "", err
	}
	cfg, brokers, err := a.saramaConfig()
	if err != nil {
		return nil, "", err
	}
	cl, err := dlq.Open(brokers, cfg)
	return cl, topic, err
}
