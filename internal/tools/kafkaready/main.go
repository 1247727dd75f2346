// Command kafkaready waits until a Kafka broker answers a metadata request that
// lists at least one broker and an active controller, or fails after a timeout.
// scripts/services.sh uses it so that "the port accepts TCP" is never mistaken
// for "the broker is up".
//
//	go run ./internal/tools/kafkaready -brokers 127.0.0.1:9092 -timeout 90s [-pid 1234]
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated bootstrap brokers")
	timeout := flag.Duration("timeout", 90*time.Second, "give up after this long")
	pid := flag.Int("pid", 0, "fail at once if this process dies while waiting")
	flag.Parse()

	deadline := time.Now().Add(*timeout)
	var last error
	for time.Now().Before(deadline) {
		if *pid > 0 && syscall.Kill(*pid, 0) != nil {
			fmt.Fprintf(os.Stderr, "kafkaready: broker process %d exited while starting\n", *pid)
			os.Exit(1)
		}
		if last = probe(strings.Split(*brokers, ",")); last == nil {
			return
		}
		time.Sleep(250 * time.Millisecond) // polling interval, not synchronisation
	}
	fmt.Fprintf(os.Stderr, "kafkaready: no broker answered at %s within %s: %v\n", *brokers, *timeout, last)
	os.Exit(1)
}

func probe(addrs []string) error {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_0_0_0
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Net.ReadTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = 0
	c, err := sarama.NewClient(addrs, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	if len(c.Brokers()) == 0 {
		return fmt.Errorf("metadata lists no broker")
	}
	if _, err := c.Controller(); err != nil {
		return fmt.Errorf("no controller yet: %w", err)
	}
	return nil
}
