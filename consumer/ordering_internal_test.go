package consumer

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/internal/keyorder"
)

// Every ordering-store error has one class: only outages are retried.
func TestOrderErrorOf(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("keyorder: park: %w", &pgconn.PgError{Code: code}) }
	tests := []struct {
		err  error
		want orderError
	}{
		{errors.New("dial tcp: connection refused"), orderOutage},
		{context.DeadlineExceeded, orderOutage},
		{pg("08006"), orderOutage}, // connection failure
		{pg("57P01"), orderOutage}, // admin shutdown
		{pg("53300"), orderOutage}, // too many connections
		{pg("40001"), orderOutage}, // serialization failure
		{pg("40P01"), orderOutage}, // deadlock
		{fmt.Errorf("keyorder: block: %w: %q", keyorder.ErrOtherHead, "h"), orderConflict},
		{pg("22021"), orderFault}, // invalid UTF-8
		{pg("23505"), orderFault}, // unique violation
		{pg("23514"), orderFault}, // check violation
		{pg("54000"), orderFault}, // index row too large
		{pg("42P01"), orderFault}, // undefined table
	}
	for _, tt := range tests {
		if got := orderErrorOf(tt.err); got != tt.want {
			t.Errorf("orderErrorOf(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
