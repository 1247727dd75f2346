package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

// TestDemoBalances runs the example end to end against real Kafka and
// PostgreSQL: every order's saga runs once (duplicate deliveries start
// nothing), declined payments release their reservation, shipping
// failures refund the charge and release the reservation.
func TestDemoBalances(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka and PostgreSQL (skipped under -short)")
	}
	brokers, db := os.Getenv("KAFKA_BROKERS"), os.Getenv("DATABASE_URL")
	if brokers == "" || db == "" {
		t.Fatal("KAFKA_BROKERS and DATABASE_URL must be set: run `make services` first (make test does it for you)")
	}
	var logs, out bytes.Buffer
	s, err := demo(t.Context(), strings.Split(brokers, ","), db, options{N: 40, Timeout: 2 * time.Minute}, &logs)
	s.print(&out)
	t.Logf("demo:\n%s\nlogs:\n%s", out.String(), logs.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.check(); err != nil {
		t.Fatalf("figures do not balance:\n%v", err)
	}
	if s.WantDeclined != 8 || s.WantNoShip != 4 || s.Duplicates != 4 {
		t.Fatalf("the run does not exercise both compensations and duplicates: %+v", s)
	}
}
