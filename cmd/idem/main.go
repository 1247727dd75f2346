// Command idem is the operator CLI of idem: inspect, replay and purge
// dead-letter topics, and create idem's tables.
//
//	idem dlq list    --topic payments.billing.dlq [--json]
//	idem dlq show    --topic payments.billing.dlq (--partition P --offset N | --key K) [--json]
//	idem dlq replay  --topic payments.billing.dlq [--to source|TOPIC [--tier N]] [--filter kind=…,error~=…,key=…] [--rate N] [--dry-run]
//	idem dlq purge   --topic payments.billing.dlq [--yes]
//	idem migrate     [--database-url URL] [--table schema.table]
//
// Global flags: --brokers (default $KAFKA_BROKERS, else 127.0.0.1:9092) and
// --kafka-version (default 4.0.0). Errors print one line on stderr and exit 1.
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
