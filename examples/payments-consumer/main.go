// Command payments-consumer is idem's reference service: it consumes payment
// events from Kafka and records them in PostgreSQL so that every retry is
// safe — a payment delivered twice is stored once and charges its order once.
//
// Usage:
//
//	payments-consumer [-topic payments] [-group payments-consumer] [-partitions 6] [-metrics-addr :9464] [-bank-failure-rate 0] [-bank-outage 4s+3s] …
//	payments-consumer demo [-n 10000] [-dup 0.10] [-bad 20] [-rate 1000] [-timeout 5m] [bank flags]
//
// Both read KAFKA_BROKERS (comma-separated host:port) and DATABASE_URL from
// the environment (`make services` prints them). The service itself is
// package payments in this directory. See README.md.
package main

import "github.com/idemhq/idem/examples/payments-consumer/payments"

func main() { payments.Main(payments.Hooks{}) }
