package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"

	"github.com/idemhq/idem/dlq"
)

// defaultBrokers is --brokers' default when KAFKA_BROKERS is not set.
const defaultBrokers = "127.0.0.1:9092"

// app holds the global flags and the I/O of one invocation.
type app struct {
	brokers      string
	kafkaVersion string
	in           io.Reader
	out, errOut  io.Writer
}

// run executes the CLI with args and returns the exit code: 0 on success, 1
// on any error (printed as one line on errOut).
func run(args []string, in io.Reader, out, errOut io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	a := &app{in: in, out: out, errOut: errOut}
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

// newRootCmd builds the command tree. Subcommands are added here; the
// migrate command is added by its own file.
func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:           "idem",
		Short:         "Operate idem consumers: dead-letter topics, schema migrations",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	brokers := os.Getenv("KAFKA_BROKERS")
	if brokers == "" {
		brokers = defaultBrokers
	}
	root.PersistentFlags().StringVar(&a.brokers, "brokers", brokers, "comma-separated Kafka bootstrap brokers (env KAFKA_BROKERS)")
	root.PersistentFlags().StringVar(&a.kafkaVersion, "kafka-version", "4.0.0", "Kafka protocol version to speak")
	root.AddCommand(newDLQCmd(a), newMigrateCmd(a))
	root.AddCommand(newOrderingCmd(a))
	root.AddCommand(newCheckpointCmd(a))
	root.AddCommand(newOutboxCmd(a))
	return root
}

// saramaConfig returns the client config the global flags ask for.
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
	return cfg, brokers, nil
}

// openDLQ connects a dlq.Client.
func (a *app) openDLQ() (*dlq.Client, error) {
	cfg, brokers, err := a.saramaConfig()
	if err != nil {
		return nil, err
	}
	return dlq.Open(brokers, cfg)
}
