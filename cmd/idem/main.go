// Command idem is the operator CLI of idem: inspect, replay and purge
// dead-letter topics, release messages parked by ordering-by-key, run the
// outbox relay, show and reset batch checkpoints, create idem's tables, and,
// for trying a consumer out, create a topic and produce records to it.
//
//	idem dlq list     (-t DLQ | --source T --group G) [--json]
//	idem dlq depth    (-t DLQ | --source T --group G) [--json]
//	idem dlq show     (-t DLQ | --source T --group G) (--partition P --offset N | --key K) [--json]
//	idem dlq replay   (-t DLQ | --source T --group G) [--to source|TOPIC [--tier N]] [--filter kind=…,error~=…,key=…] [--drop-unmatched-from-pending] [--rate N] [--dry-run]
//	idem dlq purge    (-t DLQ | --source T --group G) [--yes]
//	idem dlq list|show|replay --database-url URL …   (the failure index: per-record status, audited)
//	idem dlq resolve|archive  --database-url URL (--id N… | -t DLQ [--filter …]) [--reason R] [--actor A]
//	idem ordering list    [--group G] [--topic T] [--json]
//	idem ordering release --group G --topic T (--key K | --key-hex H | --all) --to source|TOPIC [--dry-run]
//	idem outbox relay [--database-url URL] [--metrics-addr ADDR]
//	idem outbox list  [--failed | --state S] [--json]
//	idem outbox retry ID...
//	idem checkpoint status [job] [--json]
//	idem checkpoint reset job [--to CURSOR] [--yes]
//	idem migrate      [--database-url URL] [--table schema.table]
//	idem topic create NAME --partitions N [--replication-factor R] [--config k=v]... [--if-not-exists]
//	idem produce TOPIC [--key K | --key-sep SEP [--key-header H]] [--header k=v]... [--partition P]   (one record per stdin line)
//	             [--schema-subject S | --schema-id N] [--schema-message M] [--registry-url URL]   (each line JSON, encoded with a registry schema)
//
// Commands that talk to Kafka (dlq, ordering release, outbox relay, topic,
// produce) take -b/--brokers (env KAFKA_BROKERS, default 127.0.0.1:9092),
// --kafka-version (default 4.0.0) and the TLS and SASL flags --tls, --tls-ca, --tls-cert, --tls-key,
// --tls-insecure-skip-verify, --sasl-mechanism (PLAIN, SCRAM-SHA-256,
// SCRAM-SHA-512) and --sasl-user; each flag not given is read from its
// environment variable (IDEM_TLS, IDEM_TLS_CA, …, IDEM_SASL_USER), and the
// SASL password only from IDEM_SASL_PASSWORD. Database commands take
// --database-url (env DATABASE_URL). Flags go after the command name.
//
// --version prints the module version from the build info. Errors, an
// unknown command included (with the nearest command suggested), print one
// line on stderr and exit 1.
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
