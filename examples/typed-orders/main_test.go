package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

// TestDemoBalances runs the example end to end against real Kafka,
// PostgreSQL and the schema registry: every order is decoded by its route,
// keyed from its Avro value, charged once through its step (a handler that
// fails after the charge is retried without a second charge, a duplicate
// delivery is dropped by the inbox), and every Protobuf shipment and
// return, on one topic, is recorded by its own route (by record name).
func TestDemoBalances(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka, PostgreSQL and a schema registry (skipped under -short)")
	}
	brokers, db, reg := os.Getenv("KAFKA_BROKERS"), os.Getenv("DATABASE_URL"), os.Getenv("SCHEMA_REGISTRY_URL")
	if brokers == "" || db == "" || reg == "" {
		t.Fatal("KAFKA_BROKERS, DATABASE_URL and SCHEMA_REGISTRY_URL must be set: run `make services` first (make test does it for you)")
	}
	var logs, out bytes.Buffer
	s, err := demo(t.Context(), strings.Split(brokers, ","), db, reg, options{N: 30, Timeout: 2 * time.Minute}, &logs)
	s.print(&out)
	t.Logf("demo:\n%s\nlogs:\n%s", out.String(), logs.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.check(); err != nil {
		t.Fatalf("figures do not balance:\n%v", err)
	}
	if s.Retried != 3 || s.Duplicates != 3 || s.WantShipped != 10 || s.WantReturned != 6 {
		t.Fatalf("the run does not exercise retries after a charge, duplicates and shipments: %+v", s)
	}
}
