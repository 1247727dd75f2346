// Command kafkaready waits until a Kafka broker answers a metadata request that
// lists at least one broker and an active controller, or fails after a timeout.
// scripts/services.sh uses it so that "the port accepts TCP" is never mistaken
// for "the broker is up".
//
// With -want-brokers N (N > 1, the three-node cluster) every address of
// -brokers is asked on its own, and each must list at least N brokers and a
// controller: a KRaft broker is listed only after the active controller has
// registered and unfenced it, so this also says that the controller quorum
// has a leader and that every node has caught up with the cluster metadata.
//
//	go run ./internal/testing/tools/kafkaready -brokers 127.0.0.1:9092 -timeout 90s [-pid 1234[,1235…]] [-want-brokers 3]
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated bootstrap brokers")
	timeout := flag.Duration("timeout", 90*time.Second, "give up after this long")
	pidList := flag.String("pid", "", "comma-separated process ids: fail at once if one of them dies while waiting")
	want := flag.Int("want-brokers", 1, "with more than 1: ask each address on its own; each must list at least this many brokers")
	flag.Parse()

	var pids []int
	for _, s := range strings.Split(*pidList, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := strconv.Atoi(s)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kafkaready: -pid %q: %v\n", *pidList, err)
			os.Exit(2)
		}
		pids = append(pids, p)
	}
	addrs := strings.Split(*brokers, ",")
	deadline := time.Now().Add(*timeout)
	var last error
	for time.Now().Before(deadline) {
		for _, pid := range pids {
			if pid > 0 && syscall.Kill(pid, 0) != nil {
				fmt.Fprintf(os.Stderr, "kafkaready: broker process %d exited while starting\n", pid)
				os.Exit(1)
			}
		}
		if *want > 1 {
			last = probeEach(addrs, *want)
		} else {
			last = probe(addrs)
		}
		if last == nil {
			return
		}
		time.Sleep(250 * time.Millisecond) // polling interval, not synchronisation
	}
	fmt.Fprintf(os.Stderr, "kafkaready: no broker answered at %s within %s: %v\n", *brokers, *timeout, last)
	os.Exit(1)
}

func config() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_0_0_0
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Net.ReadTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = 0
	return cfg
}

func probe(addrs []string) error {
	c, err := sarama.NewClient(addrs, config())
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

// probeEach asks every address for its own metadata.
func probeEach(addrs []string, want int) error {
	for _, a := range addrs {
		if err := probeOne(a, want); err != nil {
			return err
		}
	}
	return nil
}

func probeOne(addr string, want int) error {
	b := sarama.NewBroker(addr)
	if err := b.Open(config()); err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	defer b.Close()
	resp, err := b.GetMetadata(sarama.NewMetadataRequest(sarama.V4_0_0_0, nil))
	if err != nil {
		return fmt.Errorf("%s: metadata: %w", addr, err)
	}
	if len(resp.Brokers) < want {
		return fmt.Errorf("%s: metadata lists %d brokers, want %d", addr, len(resp.Brokers), want)
	}
	if resp.ControllerID < 0 {
		return fmt.Errorf("%s: no controller yet", addr)
	}
	return nil
}
