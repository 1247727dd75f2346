package handler_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/idemhq/idem/handler"
)

// decodeInt decodes a value that is a decimal number; "down" is a registry
// outage, anything else a record that does not decode.
func decodeInt(_ context.Context, m *handler.Message) (int, error) {
	if string(m.Value) == "down" {
		return 0, errDown
	}
	n, err := strconv.Atoi(string(m.Value))
	return n, handler.Decode(err)
}

var errDown = errors.New("registry down")

func msgs(values ...string) []*handler.Message {
	out := make([]*handler.Message, len(values))
	for i, v := range values {
		out[i] = &handler.Message{Offset: int64(i), Value: []byte(v)}
	}
	return out
}

func TestTyped(t *testing.T) {
	var got []int
	h := handler.Typed(decodeInt, func(ctx context.Context, v int, m *handler.Message) error {
		got = append(got, v)
		return nil
	})
	ctx := context.Background()
	for _, m := range msgs("1", "x", "down", "2") {
		err := h.Handle(ctx, m)
		switch string(m.Value) {
		case "x":
			if !handler.IsDecode(err) {
				t.Errorf("undecodable value: %v, want a Decode error", err)
			}
		case "down":
			if !errors.Is(err, errDown) || handler.IsDecode(err) {
				t.Errorf("outage: %v, want it unchanged", err)
			}
		default:
			if err != nil {
				t.Errorf("value %s: %v", m.Value, err)
			}
		}
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("fn got %v, want [1 2]", got)
	}
	if handler.Typed[int](nil, nil) != nil {
		t.Fatal("Typed(nil, nil) is not nil")
	}
}

// A batch: undecodable messages are named in a *BatchError and left out of
// fn's call; the rest are given to fn with their values in order; an outage
// fails the whole batch without calling fn.
func TestTypedBatch(t *testing.T) {
	ctx := context.Background()
	var calls [][]int
	var fnErr error
	h := handler.TypedBatch(decodeInt, func(ctx context.Context, vs []int, ms []*handler.Message) error {
		if len(vs) != len(ms) {
			t.Fatalf("%d values for %d messages", len(vs), len(ms))
		}
		for i := range vs {
			if strconv.Itoa(vs[i]) != string(ms[i].Value) {
				t.Fatalf("value %d is not message %d's", vs[i], i)
			}
		}
		calls = append(calls, vs)
		return fnErr
	})
	bh, ok := h.(handler.BatchHandler)
	if !ok {
		t.Fatal("TypedBatch is not a BatchHandler")
	}

	batch := msgs("1", "x", "3", "y")
	err := bh.HandleBatch(ctx, batch)
	var be *handler.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 2 || be.Failed[0].Message != batch[1] || be.Failed[1].Message != batch[3] || !handler.IsDecode(be.Failed[0].Err) {
		t.Fatalf("got %v; want a *BatchError naming messages 1 and 3 with decode errors", err)
	}
	if len(calls) != 1 || len(calls[0]) != 2 || calls[0][0] != 1 || calls[0][1] != 3 {
		t.Fatalf("fn calls %v, want [[1 3]]", calls)
	}

	// fn's own *BatchError gets the decode failures added.
	batch = msgs("5", "z", "6")
	fnErr = (&handler.BatchError{}).Add(batch[2], errors.New("no"))
	if err := bh.HandleBatch(ctx, batch); !errors.As(err, &be) || len(be.Failed) != 2 {
		t.Fatalf("got %v; want fn's failure and the decode failure", err)
	}
	fnErr = nil

	// Nothing decodes: fn is not called.
	calls = nil
	if err := bh.HandleBatch(ctx, msgs("a", "b")); !errors.As(err, &be) || len(be.Failed) != 2 || calls != nil {
		t.Fatalf("got %v, calls %v", err, calls)
	}
	// An outage: the whole batch fails with it, fn is not called.
	if err := bh.HandleBatch(ctx, msgs("7", "down")); !errors.Is(err, errDown) || calls != nil {
		t.Fatalf("outage: got %v, calls %v", err, calls)
	}
	// One message alone (Handle): its decode error is its own.
	if err := h.Handle(ctx, msgs("q")[0]); !handler.IsDecode(err) {
		t.Fatalf("Handle of an undecodable message: %v", err)
	}
}
